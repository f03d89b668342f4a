"""The quality benchmark's protocol (benchmarks/quality.py): the tasks, the start poolings,
the pools variants, the samplers over them, the peer's settings and the rows of the table.
Pure data; the runner (benchmarks/quality.py) and the table (benchmarks/quality_table.py)
read it. Rows (``ROWS``):

- ``simcse``: dropout positives, in-batch negatives; the baseline.
- ``peer``, ``uniform``, ``ipw_paper``, ``ipw_calibrated``: objective ``simcse_hn`` (the same
  dropout positives and in-batch negatives, plus 2 mined negatives per anchor): only the
  negatives differ, from the peer miner, pairforge's band pools drawn uniformly, by the paper's
  IPW equations, by the calibrated IPW.
- ``translation``: objective ``simcse_bt``, SimCSE with the pairs' ``positive_text`` (one round
  trip) as the positive instead of a dropout view: what a real translation adds alone.
- ``debcse``, ``denosent``, ``combined``: the objectives with mined positives, on the calibrated
  pairs, their demo-profile options.
- the negatives variants (``knn_*``, ``band40_*``, τ): one change each from the above, at the
  peer's depth, a higher floor, positive-aware or SimANS draws (docs/quality.md).
"""

from __future__ import annotations

from dataclasses import dataclass

TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
LABELS = dict(
    zip(TASKS, ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R"), strict=True)
)
# Start poolings: the [CLS] state (MiniLM untrained 73.69) and MiniLM's native mean (78.87).
STARTS = {"cls": "cls_before_pooler", "mean": "mean"}
POOLS = {  # pools variant -> `mine` params over the demo profile's (its own pools folder)
    "band": {},  # the profile's: k = 64 deepened while the band lasts (pool_cap 1024), [0.25, 0.75]
    # The peer's terms: the k = 64 nearest neighbours in the band only, no random fill of a
    # short pool (the peer's anchor with too few in the band gets none).
    "knn": {"pool_cap": None, "fallback": "none"},
    "band40": {"band_low": 0.4},  # the whole band above a higher floor
    # The peer's depth with the band's top opened to 0.95: a per-anchor ceiling sets the top.
    "knn_wide": {"pool_cap": None, "fallback": "none", "band_high": 0.95},
}


@dataclass(frozen=True)
class Sampler:
    """One pairs dataset: ``sample`` with ``options`` over one pools variant."""

    options: tuple[str, ...]
    pools: str = "band"


_CAL = ("--ipw", "calibrated", "--temperature", "0.5")
SAMPLERS = {
    "uniform": Sampler(("--ipw", "uniform")),
    "paper": Sampler(("--ipw", "paper", "--temperature", "1.0")),
    "calibrated": Sampler(_CAL),
    # Variants of the negatives, each one change from the above (docs/quality.md, "variants"):
    "calibrated_l2": Sampler((*_CAL, "--lambda-n", "0.2")),  # surface first: λn 0.2
    # The calibrated IPW's τ, to be chosen on dev: sharper, flatter.
    "calibrated_t025": Sampler(("--ipw", "calibrated", "--temperature", "0.25")),
    "calibrated_t1": Sampler(("--ipw", "calibrated", "--temperature", "1.0")),
    "knn_uniform": Sampler(("--ipw", "uniform"), pools="knn"),
    "knn_calibrated": Sampler(_CAL, pools="knn"),
    "band40_uniform": Sampler(("--ipw", "uniform"), pools="band40"),
    "band40_calibrated": Sampler(_CAL, pools="band40"),
    # Positive-aware negatives at the peer's depth (issue 27): the m most similar below 95% of
    # the anchor's best translation's cosine (NV-Retriever's TopK-PercPos), in a band whose top
    # is opened to 0.95 so that the ceiling, not the fixed 0.75, sets it.
    # (Against s+ = 1 a 5% margin removes nothing from a band that ends at 0.75.)
    "knn_posaware": Sampler(
        ("--negative-sampler", "top", "--relative-margin", "0.05", "--positive-reference", "best"),
        pools="knn_wide",
    ),
    "knn_simans": Sampler(
        (
            "--negative-sampler",
            "simans",
            "--simans-a",
            "10",
            "--simans-b",
            "-0.3",
            "--positive-reference",
            "fixed",
        ),
        pools="knn",
    ),  # fmt: skip
}
# The peer's negatives: its defaults in these settings (``random``), and its recommended
# ``sampling_strategy="top"`` with ``relative_margin=0.05``.
PEERS = {"peer": ("random", None), "peer_top": ("top", 0.05)}
PIPELINE = ("ingest", "standin", "backtranslate", "rewrite", "embed", "mine")


@dataclass(frozen=True)
class Row:
    """One row of the table: an objective trained on one sampler's pairs."""

    objective: str
    pairs: str  # a key of SAMPLERS, or "peer"
    label: str
    prompt: bool = False  # DenoSent: the [MASK] of its prompt is the vector, whatever the start


ROWS: dict[str, Row] = {
    "simcse": Row("simcse", "calibrated", "SimCSE (dropout positives, in-batch negatives)"),
    "peer": Row("simcse_hn", "peer", "+ negatives of ST mine_hard_negatives (random)"),
    "peer_top": Row(
        "simcse_hn", "peer_top", "+ negatives of ST mine_hard_negatives (top, relative_margin 0.05)"
    ),
    "uniform": Row("simcse_hn", "uniform", "+ negatives of pairforge's band, uniform"),
    "ipw_paper": Row("simcse_hn", "paper", "+ negatives by IPW, the paper's equations"),
    "ipw_calibrated": Row("simcse_hn", "calibrated", "+ negatives by IPW, calibrated"),
    "ipw_calibrated_l2": Row(
        "simcse_hn", "calibrated_l2", "+ negatives by IPW, calibrated, λn 0.2"
    ),
    "ipw_calibrated_t025": Row(
        "simcse_hn", "calibrated_t025", "+ negatives by IPW, calibrated, τ 0.25"
    ),
    "ipw_calibrated_t1": Row("simcse_hn", "calibrated_t1", "+ negatives by IPW, calibrated, τ 1"),
    "knn_uniform": Row(
        "simcse_hn", "knn_uniform", "+ negatives of the 64 nearest in the band, uniform"
    ),
    "knn_calibrated": Row(
        "simcse_hn", "knn_calibrated", "+ negatives of the 64 nearest in the band, IPW calibrated"
    ),
    "band40_uniform": Row(
        "simcse_hn", "band40_uniform", "+ negatives of the band [0.4, 0.75], uniform"
    ),
    "band40_calibrated": Row(
        "simcse_hn", "band40_calibrated", "+ negatives of the band [0.4, 0.75], IPW calibrated"
    ),
    "knn_posaware": Row(
        "simcse_hn",
        "knn_posaware",
        "+ the 2 nearest of the 64 below 95% of the best translation's cos (TopK-PercPos)",
    ),
    "knn_simans": Row(
        "simcse_hn", "knn_simans", "+ negatives of the 64 nearest, SimANS (a 10, b -0.3)"
    ),
    "translation": Row(
        "simcse_bt", "calibrated", "SimCSE, a round-trip translation as the positive"
    ),
    "debcse": Row("debcse", "calibrated", "DebCSE (mined positives and negatives)"),
    "denosent": Row("denosent", "calibrated", "DenoSent", prompt=True),
    "combined": Row("combined", "calibrated", "DebCSE + DenoSent's denoising (combined)"),
}
# The rows that differ from SimCSE by their mined negatives alone.
NEGATIVE_ROWS = tuple(name for name, row in ROWS.items() if row.objective == "simcse_hn")
# The row of the profile's negatives (its sampler over its pools): the one the targets judge.
DEFAULT_ROW = "ipw_calibrated"
PEER_ROWS = tuple(PEERS)
