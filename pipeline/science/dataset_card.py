"""The dataset card of a ``pairs`` dataset: what it is, how it was mined, counts, score
distributions, the source corpus and its licence, and how to load it.

The card is ``README.md`` at the top of the dataset folder, the shards in ``data/`` beside it:
the folder is laid out as a Hugging Face Hub dataset, whose card's YAML front matter points
``datasets.load_dataset(folder)`` at ``data/*.parquet``, and ``data/`` holds only Parquet, so every
folder reader (polars, pyarrow, DuckDB) reads it as a table.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import yaml

CARD = "README.md"


# Licence identifiers the Hub accepts in a card's ``license`` field (a subset: the common ones).
HUB_LICENSES = frozenset(
    [
        "apache-2.0",
        "mit",
        "cc0-1.0",
        "cc-by-2.0",
        "cc-by-2.5",
        "cc-by-3.0",
        "cc-by-4.0",
        "cc-by-sa-3.0",
        "cc-by-sa-4.0",
        "cc-by-nc-2.0",
        "cc-by-nc-3.0",
        "cc-by-nc-4.0",
        "cc-by-nc-sa-3.0",
        "cc-by-nc-sa-4.0",
        "cc-by-nd-4.0",
        "cc-by-nc-nd-4.0",
        "gpl-2.0",
        "gpl-3.0",
        "lgpl-3.0",
        "agpl-3.0",
        "bsd-2-clause",
        "bsd-3-clause",
        "mpl-2.0",
        "odc-by",
        "odbl",
        "pddl",
        "gfdl",
        "unlicense",
        "wtfpl",
        "other",
        "unknown",
    ]
)


def hub_license(text: str | None) -> str:
    """A licence as written in params (``CC0-1.0``, ``CC BY-SA 3.0 (Wikipedia text)``) -> the
    Hub identifier (``cc0-1.0``, ``cc-by-sa-3.0``); ``unknown`` when empty, ``other`` when it is
    none of :data:`HUB_LICENSES` (the card's text then names the licence as written)."""
    if not text or not text.strip():
        return "unknown"
    name = re.sub(r"[\s_-]+", "-", text.split("(")[0].strip().lower())
    name = name.replace("creative-commons-", "cc-").replace("apache-license-", "apache-")
    return name if name in HUB_LICENSES else "other"


# The Hub's size buckets (``size_categories``): the first whose bound exceeds the row count.
SIZE_CATEGORIES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
    (10_000_000_000, "1B<n<10B"),
    (100_000_000_000, "10B<n<100B"),
    (1_000_000_000_000, "100B<n<1T"),
)
HUB_TAGS = ("sentence-transformers", "pairforge", "hard-negatives")


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` bucket of ``rows``."""
    return next((label for bound, label in SIZE_CATEGORIES if rows < bound), "n>1T")


def hub_metadata(
    license: str | None,
    rows: int,
    pretty_name: str | None = None,
    source: str | None = None,
    tags: tuple[str, ...] = (),
    data_files: str = "data/*.parquet",
) -> dict[str, Any]:
    """A Hub card's front matter: the train split's files, the licence Hub id, the language,
    task, size bucket, tags, a display name and the corpus's Hub id (``source_datasets``) when
    known."""
    meta: dict[str, Any] = {
        "configs": [
            {"config_name": "default", "data_files": [{"split": "train", "path": data_files}]}
        ],
        "license": hub_license(license),
        "language": ["en"],
        "task_categories": ["sentence-similarity"],
        "size_categories": [size_category(rows)],
        "tags": [*HUB_TAGS, *tags],
    }
    if pretty_name:
        meta["pretty_name"] = pretty_name
    if source:
        meta["source_datasets"] = [source]
    return meta


def front_matter(meta: dict[str, Any]) -> str:
    """``meta`` as the card's YAML header between ``---`` lines."""
    return f"---\n{yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()}\n---\n"


def distribution(values: np.ndarray, digits: int = 4) -> dict[str, float | int | None]:
    """Count, mean and quantiles of ``values`` (NaNs dropped), rounded to ``digits`` decimals."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return {"count": 0, "mean": None, "p10": None, "p50": None, "p90": None}
    q = np.percentile(values, [10, 50, 90])
    return {
        "count": int(values.size),
        "mean": round(float(values.mean()), digits),
        "p10": round(float(q[0]), digits),
        "p50": round(float(q[1]), digits),
        "p90": round(float(q[2]), digits),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _ipw_words(params: dict[str, Any]) -> str:
    if params.get("ipw", "paper") == "calibrated":
        return (
            "in the calibrated form (one softmax over the pool's z-scored edit and cosine, "
            f"temperature τ = {params.get('temperature')}; see the sharpness section)"
        )
    return f"eqs. 1-6 as printed, softmax temperature {params.get('temperature')} (1 = the paper)"


def render_card(
    *,
    name: str,
    schema_doc: str,
    columns: list[tuple[str, str]],
    params: dict[str, Any],
    encoder: dict[str, Any],
    mining: dict[str, Any],
    counts: dict[str, Any],
    distributions: dict[str, dict[str, Any]],
    source: dict[str, Any],
) -> str:
    """The card's markdown. ``distributions`` maps a score name to ``distribution()`` output."""
    sections = [
        _intro(name, params, schema_doc),
        _how_mined_section(params, encoder, mining),
        _counts_section(counts),
        _distributions_section(distributions),
        _source_section(source),
        _columns_section(columns),
        _loading_section(source.get("path")),
    ]
    # Each section ends its last line; one more newline between them is the blank line.
    meta = hub_metadata(
        source.get("corpus_license"),
        int(counts.get("rows") or 0),
        pretty_name=f"{name}: DebCSE-mined sentence pairs",
        source=source.get("corpus_source"),
        tags=("debcse",),
    )
    return front_matter(meta) + "\n" + "\n".join(sections)


def _intro(name: str, params: dict[str, Any], schema_doc: str) -> str:
    """The title, what a row holds for each objective (the routes from the sample stage's
    ``params``), and the schema's own description ``schema_doc``."""
    return f"""# {name}: DebCSE-mined sentence pairs

Training pairs for unsupervised sentence-embedding objectives, mined by
pairforge from an unlabeled corpus. One row per anchor sentence:

- **DebCSE**: `positive_texts` (augmentations of the anchor, sampled by P_pos, eqs. 5-6) and
  `negative_texts` (other corpus sentences sampled by P_neg, eqs. 3-4 of DebCSE, CIKM'23);
- **DenoSent**: `positive_text` (one {params.get("positive_route")} back-translation);
- **BSL**: `view1_text` ({params.get("view1_route")}) and `view2_text` ({params.get("view2_route")});
- **SimCSE**: `text` alone.

Every score the sampler used is a column, so the sampling can be audited or redone.

{schema_doc}
"""


def _how_mined_section(
    params: dict[str, Any], encoder: dict[str, Any], mining: dict[str, Any]
) -> str:
    """The "How it was mined" section, five steps: the ``encoder``, the negative pools
    (``mining``: k, pool cap, index and its recall, band, near-duplicate threshold, fallback),
    the positive pools, the scores and the sampling (the sample stage's ``params``)."""
    index = mining.get("index", {})
    return f"""## How it was mined

1. **Embeddings**: `{encoder.get("model")}`, `{encoder.get("pooling")}` pooling, max length
   {encoder.get("max_length")}, {encoder.get("dim")}-d, L2-normalised.
2. **Negative pools**: the nearest neighbours of each anchor (k = {mining.get("k")}, doubled
   while its band lasts, up to {mining.get("pool_cap") or mining.get("k")}) in a FAISS
   `{index.get("kind")}` inner-product index (recall@k against exact search:
   {_fmt(index.get("recall_at_k"))}), kept when their cosine lies in
   [{mining.get("band_low")}, {mining.get("band_high")}] and they are not the anchor, an exact or
   near duplicate of it (rapidfuzz ratio >= {mining.get("near_duplicate_threshold")}) or one of its
   own augmentations. Pools under {mining.get("min_pool")} candidates: fallback
   `{mining.get("fallback")}` (recorded per row in `fallback`).
3. **Positive pools**: the anchor's augmentation candidates (routes and noise in
   `positive_routes` / `positive_noises`); candidates identical to the anchor: `{params.get("identical")}`.
4. **Scores**: `edit` = {"normalised" if params.get("edit_normalized") else "raw"}
   {params.get("edit_kind")}-level {params.get("edit_metric")} distance to the anchor; `cos` =
   cosine under the encoder; `s_sur`, `s_sem` = eqs. 1-2 (softmax over the pool); `prob` = P_neg
   (λn = {params.get("lambda_n")}) or P_pos (λp = {params.get("lambda_p")}),
   {_ipw_words(params)}. `<side>_entropy` = H(P) / log(pool size): 1 is uniform sampling.
5. **Sampling**: m = {params.get("m")} negatives and {params.get("m_positive") or params.get("m")}
   positives per anchor without replacement, seed {params.get("seed")}, {_draws_words(params)};
   rows short of negatives: `{params.get("short")}`. {_selection_words(params)}
"""


def _draws_words(params: dict[str, Any]) -> str:
    """How the draws' randomness was had (``sample.draws``)."""
    if params.get("draws", "stream") == "keyed":
        return (
            "keyed draws (each candidate's random number hashed from the seed, its anchor and "
            "itself: an anchor's draw depends on its own pool alone)"
        )
    return "one random generator per (seed, shard, anchor batch)"


def _selection_words(params: dict[str, Any]) -> str:
    """Which pool candidates could be drawn as negatives, and by which sampler."""
    rules = []
    low, high = params.get("range_min") or 0, params.get("range_max")
    if low or high is not None:
        rules.append(f"ranks {low} to {'the last' if high is None else high - 1} by cosine")
    ceiling = []
    if params.get("absolute_margin") is not None:
        ceiling.append(f"cos <= s+ - {params['absolute_margin']}")
    if params.get("relative_margin") is not None:
        ceiling.append(f"cos <= s+ x (1 - {params['relative_margin']})")
    if ceiling:
        ref = (
            f"s+ = {params.get('positive_score')}"
            if params.get("positive_reference") == "fixed"
            else "s+ = the cosine of the anchor's best positive candidate "
            f"({params.get('positive_score')} without one)"
        )
        rules.append(" and ".join(ceiling) + f", {ref}")
    sampler = params.get("negative_sampler", "ipw")
    how = {
        "ipw": "by P_neg",
        "top": "the most similar first (no randomness)",
        "simans": f"by SimANS, p ~ exp(-{params.get('simans_a')} (cos - s+ - "
        f"({params.get('simans_b')}))^2)",
    }.get(sampler, sampler)
    kept = "; ".join(rules) if rules else "every pool candidate"
    return f"Negatives drawn {how} from {kept} (removals in the counts below)."


def _counts_section(counts: dict[str, Any]) -> str:
    """The "Counts" table: one row per entry of ``counts``, in its order."""
    rows = [[key, value] for key, value in counts.items()]
    return f"""## Counts

{_table(["what", "count"], rows)}
"""


def _distributions_section(distributions: dict[str, dict[str, Any]]) -> str:
    """The "Score distributions" table: count, mean and quantiles per score name."""
    rows = [
        [key, d["count"], d["mean"], d["p10"], d["p50"], d["p90"]]
        for key, d in distributions.items()
    ]
    return f"""## Score distributions (sampled items)

{_table(["score", "count", "mean", "p10", "p50", "p90"], rows)}
"""


def _source_section(source: dict[str, Any]) -> str:
    """The "Source corpus and licence" section: the corpus, its size and input files, its
    licence as written (the dataset carries it) and the augmentations used."""
    return f"""## Source corpus and licence

- Corpus: {source.get("corpus_name")} ({source.get("sentences")} sentences from
  {", ".join(source.get("inputs") or []) or "-"}).
- Licence of the corpus text: **{source.get("corpus_license")}**. Rows quote corpus sentences and
  machine-generated paraphrases of them, so the dataset carries the corpus's licence terms.
- Augmentations: {source.get("augmentations") or "none"}.
"""


def _columns_section(columns: list[tuple[str, str]]) -> str:
    """The "Columns" table: each ``(name, type)`` of the dataset's schema."""
    rows = [[f"`{c}`", t] for c, t in columns]
    return f"""## Columns

{_table(["column", "type"], rows)}
"""


def _loading_section(path: str | None) -> str:
    """The "Loading" section: reading the folder at ``path`` with datasets, polars, pyarrow and
    DuckDB, the export to sentence-transformers layouts, and checking it against its manifest."""
    return f"""## Loading

```python
import datasets
d = datasets.load_dataset("{path}", split="train")

import polars as pl
df = pl.read_parquet("{path}/data")

import pyarrow.parquet as pq
table = pq.read_table("{path}/data")

import duckdb
duckdb.sql("select text, negative_texts from '{path}/data/*.parquet'")
```

`pairforge export --format triplet` writes the sentence-transformers (anchor, positive, negative)
layout. `_manifest.json` records the schema, params, fingerprint, code version and each shard's
size, sha256 and xxh3_128; `pairforge verify {path}` checks the shards against it.
"""


# --- how far sampling is from uniform (a self-contained card section) ---------------------------

# Mean entropy ratio above which the card and the metrics call sampling near-uniform.
NEAR_UNIFORM = 0.99


def effective_number(entropy, sizes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pool of at least 2 candidates: ``(entropy ratio, exp(H), exp(H) / n)``.

    ``entropy`` is the ``<side>_entropy`` column (H / log n), ``sizes`` the ``<side>_pool_size``
    column; exp(H) = n ** ratio, the number of equally likely candidates the draw is worth. Pools
    of 0 or 1 candidates are left out: they have no choice to make, uniform or not.
    """
    ratio = np.asarray(
        entropy.to_numpy(zero_copy_only=False) if hasattr(entropy, "to_numpy") else entropy,
        dtype=np.float64,
    )
    n = np.asarray(
        sizes.to_numpy(zero_copy_only=False) if hasattr(sizes, "to_numpy") else sizes,
        dtype=np.float64,
    )
    keep = (n >= 2) & np.isfinite(ratio)
    ratio, n = ratio[keep], n[keep]
    eff = n**ratio
    return ratio, eff, eff / n


def sharpness(entropy: dict[str, Any], ipw: str, temperature: float) -> dict[str, Any]:
    """The ``sharpness`` metrics: per side, the entropy ratio, the effective number of candidates
    and its share of the pool over pools of >= 2 candidates (``distribution()`` dicts, from
    ``<side>_entropy2``, ``<side>_effective``, ``<side>_effective_share`` of ``entropy``), and
    ``near_uniform``: mean entropy ratio > ``NEAR_UNIFORM``."""
    out: dict[str, Any] = {
        "ipw": ipw,
        "temperature": temperature,
        "near_uniform_above": NEAR_UNIFORM,
    }
    for side in ("negative", "positive"):
        ratio = entropy[f"{side}_entropy2"]
        out[side] = {
            "entropy_ratio": ratio,
            "effective_candidates": entropy[f"{side}_effective"],
            "effective_share": entropy[f"{side}_effective_share"],
            "near_uniform": ratio["mean"] is not None and ratio["mean"] > NEAR_UNIFORM,
        }
    return out


def sharpness_section(sharp: dict[str, Any]) -> str:
    """The card's "How sharp the sampling is" section, from :func:`sharpness`."""
    rows, notes = [], []
    for side in ("negative", "positive"):
        s = sharp[side]
        for label, key in (
            ("entropy ratio H/log n", "entropy_ratio"),
            ("effective candidates exp(H)", "effective_candidates"),
            ("effective share exp(H)/n", "effective_share"),
        ):
            d = s[key]
            rows.append([side, label, d.get("count"), d["mean"], d["p10"], d["p50"], d["p90"]])
        if s["near_uniform"]:
            notes.append(
                f"**{side} sampling is NEAR-UNIFORM** (mean entropy ratio "
                f"{_fmt(s['entropy_ratio']['mean'])} > {NEAR_UNIFORM}): P barely prefers any "
                "candidate, so the debiasing does almost nothing."
            )
    form = {
        "paper": "the paper's eqs. 1-6 as printed",
        "calibrated": "calibrated: one softmax over z-scored edit and cosine",
        "uniform": "uniform: 1/n within each pool, no debiasing (a control)",
    }[sharp["ipw"]]
    verdict = "\n\n".join(notes) or (
        "Neither side is near-uniform (mean entropy ratio <= "
        f"{NEAR_UNIFORM} on both): P prefers the harder candidates by a real amount."
    )
    return f"""## How sharp the sampling is

IPW form: {form}, temperature {_fmt(sharp["temperature"])}. Per pool of at least 2 candidates:
the entropy ratio H(P)/log n (1 = uniform), the effective number of candidates exp(H) (how many
equally likely candidates the draw is worth) and its share of the pool.

{_table(["side", "measure", "pools", "mean", "p10", "p50", "p90"], rows)}

{verdict}
"""
