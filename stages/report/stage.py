"""report: DebCSE's pair diagnostics (Tables 1 and 4, Figures 1 and 4) for the mined pairs.

Lexical overlap (shared words / words of the longer sentence) and cosine similarity of three
kinds of (positive, negative) pairs, all under the encoder that mined them:

- **mined**: anchors with their sampled positives and negatives (``data/pairs``);
- **SimCSE-style**: a sentence with itself under two dropout masks (the encoder in training mode,
  SimCSE's positive) and with a random corpus sentence (its in-batch negative);
- **supervised NLI** (when ``nli`` is given): SNLI premises with their entailed and contradicting
  hypotheses (SentEval layout: ``s1.<split>``, ``s2.<split>``, ``labels.<split>``).

A separate stage, not part of ``sample``: it loads the encoder again (to embed the NLI and the
dropout pairs), which the sampler does not need, and it can be rerun with other diagnostics
settings without touching the training data. Outputs: ``<reports>/mining.md`` (summary table
beside the paper's numbers), ``<reports>/mining_overlap.png`` and ``mining_cosine.png``
(histograms), ``<plots>/mining_overlap.csv`` and ``mining_cosine.csv`` (the same as DVC plots
data), and the metrics JSON. Then each route's positive candidates, beside those of any other
candidates datasets named (a stand-in run's): cosine and edit ratio to the sentence
(``stages.report.positives``; a table in ``mining.md`` and ``<reports>/positives_by_route.png``).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow.compute as pc
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.files import atomic_write_bytes
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.pipeline.science.mining_inputs import encoder_info, load_vectors, open_embeddings
from pairforge.pipeline.science.models import model_label
from pairforge.stages.options import stage_command
from pairforge.stages.report import diagnostics as D
from pairforge.stages.report import positives as P
from pydantic import Field

log = logging.getLogger("pairforge")

NLI_LABELS = {"entailment": "positive", "contradiction": "negative"}
ROUTES_PNG = "positives_by_route.png"


class ReportConfig(StageConfig):
    """The ``report`` section of params.yaml."""

    pairs: str = Field("data/pairs", description="pairs dataset folder")
    sentences: str = Field("data/sentences", description="sentences dataset folder")
    embeddings: str = Field("data/embeddings/sentences", description="sentence embeddings folder")
    nli: str | None = Field(
        "$PAIRFORGE_SHARED_DATA/nli/snli_senteval",
        description="SentEval-layout SNLI folder ($VARS expanded; unset variable: skipped); null: off",
    )
    nli_split: Literal["dev", "test"] = Field("dev", description="dev or test")
    nli_pairs: int = Field(1000, ge=0, description="pairs per label (0: all)")
    simcse_pairs: int = Field(500, ge=0, description="sentences encoded twice with dropout")
    random_pairs: int = Field(2000, ge=1, description="random sentence pairs")
    max_pairs: int = Field(20000, ge=1, description="mined pairs per side, sampled")
    bins: int = Field(40, ge=5, description="histogram bins")
    read_anchors: int = Field(
        20, ge=0, description="anchors shown with their pairs and scores, for a person to read"
    )
    candidates: str = Field(
        "data/candidates", description="positive candidates whose routes are measured"
    )
    compare_candidates: list[str] = Field(
        default_factory=list,
        description="other candidates datasets measured beside (e.g. a stand-in run's)",
    )
    route_pairs: int = Field(500, ge=1, description="clean round trips measured per route")
    seed: int = Field(0, description="sampling seed")
    device: str = Field("auto", description="auto, cpu or cuda")
    batch_size: int = Field(64, ge=1, description="texts per forward pass")
    threads: int = Field(-1, description="CPU threads for torch; -1: torch's default")
    reports: str = Field("reports", description="folder of mining.md and the PNG histograms")
    plots: str = Field("plots", description="folder of the DVC plots CSVs")
    metrics: str = Field("metrics/report.json", description="metrics JSON path")


# The mining histograms, one series per (source, side) (diagnostics.SERIES), each drawn as one
# figure by dvc.yaml's top-level `plots:` (DVC's stage-level plots take one y column). A source
# a run did not measure (NLI without its data) is an empty column.
_SERIES = {"x": "bin", "y": list(D.SERIES), "template": "linear", "y_label": "fraction of pairs"}
DVC_PLOTS = {
    "${report.plots}/mining_overlap.csv": {
        "title": "Lexical overlap of positive and negative pairs (fraction of pairs per bin)",
        **_SERIES,
        "x_label": "lexical overlap (shared words / words of the longer sentence)",
    },
    "${report.plots}/mining_cosine.csv": {
        "title": "Cosine similarity of positive and negative pairs (fraction of pairs per bin)",
        **_SERIES,
        "x_label": "cosine under the mining encoder",
    },
}

STAGE = StageDef(
    name="report",
    module=__name__,
    config=ReportConfig,
    inputs=(
        "${report.pairs}",
        "${report.sentences}",
        "${report.embeddings}",
        "${report.candidates}",
    ),
    outputs=("reports", "plots", "metrics"),
    free=("device", "batch_size", "threads"),
    outs={
        "${report.metrics}": {"cache": False},
        "${report.reports}/mining.md": {"cache": False},
        "${report.plots}/mining_overlap.csv": {"cache": False},
        "${report.plots}/mining_cosine.csv": {"cache": False},
    },
    plots={
        "${report.reports}/mining_overlap.png": {"cache": False},
        "${report.reports}/mining_cosine.png": {"cache": False},
        "${report.reports}/positives_by_route.png": {"cache": False},
    },
    headlines={
        "overlap_pos": "summary.mined.positive.overlap.mean",
        "overlap_neg": "summary.mined.negative.overlap.mean",
    },
    dvc_plots=DVC_PLOTS,
)


def _nli_folder(spec: str | None) -> tuple[Path | None, str]:
    if spec is None:
        return None, "disabled"
    expanded = os.path.expandvars(spec)
    if "$" in expanded:
        return None, f"skipped: {spec} names an unset environment variable"
    path = Path(expanded)
    if expanded != spec and not path.exists():  # shared data that this machine does not have
        return None, f"skipped: {path} (from {spec}) does not exist"
    if not path.is_dir():
        raise ConfigError(f"report.nli: {str(path)!r} is not a folder (SentEval SNLI layout)")
    return path, "used"


def read_nli(folder: Path, split: str) -> dict[str, tuple[list[str], list[str]]]:
    """SentEval SNLI pairs by label: ``{label: (premises, hypotheses)}``, whitespace-trimmed."""
    files = [folder / f"{name}.{split}" for name in ("s1", "s2", "labels")]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise ConfigError(f"report.nli: missing {', '.join(missing)}")
    s1, s2, labels = (f.read_text(encoding="utf-8").splitlines() for f in files)
    if not len(s1) == len(s2) == len(labels):
        raise PairforgeError(
            f"report.nli: {folder} has {len(s1)} premises, {len(s2)} hypotheses and "
            f"{len(labels)} labels for split {split!r}; they must align line by line"
        )
    out: dict[str, tuple[list[str], list[str]]] = {label: ([], []) for label in NLI_LABELS}
    for a, b, label in zip(s1, s2, labels, strict=True):
        label = label.strip()
        if label in out:
            out[label][0].append(a.strip())
            out[label][1].append(b.strip())
    return out


def _sample(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(n, size=k, replace=False)) if k < n else np.arange(n)


def _mined(cfg: ReportConfig, rng: np.random.Generator) -> dict[str, dict[str, np.ndarray]]:
    table = open_dataset(cfg.pairs, S.PAIRS).read_table(
        [S.TEXT, S.POSITIVE_TEXTS, "positive_cos", S.NEGATIVE_TEXTS, "negative_cos"]
    )
    out = {}
    for side, texts_col in (("positive", S.POSITIVE_TEXTS), ("negative", S.NEGATIVE_TEXTS)):
        lengths = pc.list_value_length(table[texts_col]).to_numpy(zero_copy_only=False)
        anchors = np.repeat(np.arange(table.num_rows), lengths)
        others = pc.list_flatten(table[texts_col]).to_pylist()
        cos = pc.list_flatten(table[f"{side}_cos"]).to_numpy(zero_copy_only=False)
        pick = _sample(len(others), cfg.max_pairs, rng)
        anchor_texts = table[S.TEXT].take(anchors[pick]).to_pylist() if pick.size else []
        out[side] = {
            "overlap": D.lexical_overlap(anchor_texts, [others[i] for i in pick]),
            "cos": cos[pick].astype(np.float64),
        }
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def pairs_to_read(path: str, n: int, seed: int) -> str:
    """A markdown section: ``n`` anchors (seeded, among those with a positive and a negative)
    with every sampled positive and negative, its sampling probability P, cosine and edit
    distance to the anchor, so that a person can judge the pairs, not only their averages."""
    sides = ("positive", "negative")
    cols = [S.TEXT] + [f"{side}_{c}" for side in sides for c in ("texts", "prob", "cos", "edit")]
    table = open_dataset(path, S.PAIRS).read_table(cols)
    has = np.ones(table.num_rows, dtype=bool)
    for side in sides:
        has &= pc.list_value_length(table[f"{side}_texts"]).to_numpy(zero_copy_only=False) > 0
    rows = np.flatnonzero(has)
    if not n or not rows.size:
        return ""
    # Its own generator: the diagnostics' draws stay what they were without this section.
    pick = np.sort(np.random.default_rng([seed, 1]).choice(rows, min(n, rows.size), False))
    parts = [
        "## A sample of pairs to read",
        "",
        f"{len(pick)} anchors drawn at random (seed {seed}) from the {rows.size:,} with a "
        "positive and a negative. `+`: sampled positive (an augmentation of the anchor), "
        "`-`: sampled negative (another corpus sentence); P: its sampling probability within "
        "its pool, cos: cosine to the anchor, edit: edit distance to the anchor.",
    ]
    for k, r in enumerate(pick.tolist(), 1):
        row = table.slice(r, 1).to_pylist()[0]
        parts += ["", f"**{k}.** {_cell(row[S.TEXT])}", "", "| | text | P | cos | edit |"]
        parts.append("|---|---|---|---|---|")
        for side, mark in (("positive", "+"), ("negative", "-")):
            for j, text in enumerate(row[f"{side}_texts"]):
                p, c, e = (row[f"{side}_{x}"][j] for x in ("prob", "cos", "edit"))
                parts.append(f"| {mark} | {_cell(text)} | {p:.3f} | {c:.3f} | {e:.3f} |")
    return "\n".join(parts) + "\n"


def run(cfg: ReportConfig) -> dict[str, Any]:
    """Compute the diagnostics and write the report, figures, plots data and metrics."""
    t0 = time.monotonic()
    # One generator for every draw, in a fixed order: mined, random, dropout, then NLI pairs.
    rng = np.random.default_rng(cfg.seed)
    nli_dir, nli_status = _nli_folder(cfg.nli)
    pairs: dict[str, dict[str, dict[str, np.ndarray]]] = {"mined": _mined(cfg, rng)}
    if not len(pairs["mined"]["negative"]["cos"]) and not len(pairs["mined"]["positive"]["cos"]):
        raise PairforgeError(f"report: {cfg.pairs} holds no sampled pair to diagnose")
    texts, vectors, info = _corpus(cfg)
    simcse = {"negative": _random_pairs(texts, vectors, cfg.random_pairs, rng)}
    encoder = _encoder(cfg, info)  # the dropout, NLI and route pairs are encoded here
    if cfg.simcse_pairs:
        simcse["positive"] = _dropout_pairs(encoder, texts, cfg.simcse_pairs, rng)
    pairs["simcse"] = simcse
    nli_counts: dict[str, int] = {}
    if nli_dir is not None:
        pairs["nli"], nli_counts = _nli_pairs(encoder, nli_dir, cfg, rng)

    series = P.measure(
        [cfg.candidates, *cfg.compare_candidates], encoder.encode, cfg.route_pairs, cfg.seed
    )
    routes = P.summary(series)
    P.plot(series, Path(cfg.reports) / ROUTES_PNG, model_label(info.get("model")), cfg.bins)

    summary = D.summarise(pairs)
    reports = Path(cfg.reports)
    _write_figures(pairs, cfg, info)
    text = _report_text(cfg, summary, info, nli_dir, nli_status, nli_counts)
    text += "\n" + P.markdown(routes, str(info.get("model")), cfg.route_pairs, ROUTES_PNG)
    reports.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(reports / "mining.md", text.encode())
    metrics = {
        "summary": summary,
        "paper_overlap": {k: list(v) for k, v in D.PAPER_OVERLAP.items()},
        "nli": {"status": nli_status, "split": cfg.nli_split, "pairs": nli_counts},
        "positives_by_route": routes,
        "encoder": {k: info.get(k) for k in ("model", "pooling", "dim")},
        "seconds": round(time.monotonic() - t0, 3),
    }
    StageRun(STAGE, cfg).finish(metrics)  # the metrics and their headline
    _log_summary(summary, reports / "mining.md")
    return metrics


def _log_summary(summary: dict[str, Any], report: Path) -> None:
    """One log line: the mined pairs' mean overlap beside the paper's, and where the report is."""
    m = summary["mined"]
    log.info(
        "report: mined overlap %s / %s (positive / negative; paper 0.56 / 0.21), written to %s",
        m["positive"]["overlap"]["mean"],
        m["negative"]["overlap"]["mean"],
        report,
    )


def _corpus(cfg: ReportConfig) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    """The corpus texts by row, their embeddings ``(n, dim)`` and the encoder that made them
    (``encoder_info``: model, pooling, dtype, max_length, prompt, dim)."""
    sentences = open_dataset(cfg.sentences, S.SENTENCES).read_table([S.ID, S.TEXT])
    embeddings = open_embeddings(cfg.embeddings)
    vectors = load_vectors(embeddings, sentences[S.ID].combine_chunks())
    return sentences[S.TEXT].to_pylist(), vectors, encoder_info(embeddings)


def _random_pairs(
    texts: list[str], vectors: np.ndarray, k: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """``k`` random pairs of two different corpus sentences (SimCSE's in-batch negatives):
    their lexical overlap and cosine, each ``(k,)`` float64."""
    n = len(texts)
    a = rng.integers(0, n, k)
    b = (a + rng.integers(1, max(n, 2), k)) % n  # never the same sentence
    return {
        "overlap": D.lexical_overlap([texts[i] for i in a], [texts[i] for i in b]),
        "cos": np.einsum("ij,ij->i", vectors[a], vectors[b]).astype(np.float64),
    }


def _encoder(cfg: ReportConfig, info: dict[str, Any]) -> Any:
    """The mining encoder (``info``) loaded again, for the dropout and NLI pairs; torch is
    seeded with ``cfg.seed`` first, so the dropout masks repeat."""
    import torch
    from pairforge.pipeline.science.models import load_text_encoder

    torch.manual_seed(cfg.seed)
    return load_text_encoder(
        info["model"],
        info["pooling"],
        device=cfg.device,
        dtype=info.get("dtype", "float32"),
        max_length=info.get("max_length", 128),
        batch_size=cfg.batch_size,
        threads=cfg.threads,
        **({"prompt": info["prompt"]} if info.get("prompt") else {}),
    )


def _dropout_pairs(
    encoder: Any, texts: list[str], k: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """``k`` corpus sentences (sampled without replacement) each encoded twice with dropout on
    (SimCSE's positives): their overlap (1.0) and cosine, each ``(k,)`` float64."""
    pick = _sample(len(texts), k, rng)
    chosen = [texts[i] for i in pick]
    v1 = encoder.encode(chosen, dropout=True)
    v2 = encoder.encode(chosen, dropout=True)
    return {
        "overlap": D.lexical_overlap(chosen, chosen),
        "cos": np.einsum("ij,ij->i", v1, v2).astype(np.float64),
    }


def _nli_pairs(
    encoder: Any, folder: Path, cfg: ReportConfig, rng: np.random.Generator
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, int]]:
    """SNLI (premise, hypothesis) pairs of ``cfg.nli_split``, ``cfg.nli_pairs`` per label (0:
    all): their overlap and cosine by side (entailment: positive, contradiction: negative),
    and the pairs used by label."""
    nli, counts = {}, {}
    for label, (premises, hypotheses) in read_nli(folder, cfg.nli_split).items():
        pick = _sample(len(premises), cfg.nli_pairs or len(premises), rng)
        p = [premises[i] for i in pick]
        h = [hypotheses[i] for i in pick]
        # Each distinct text encoded once: a premise recurs across its hypotheses.
        unique = list(dict.fromkeys(p + h))
        where = {t: i for i, t in enumerate(unique)}
        vec = encoder.encode(unique)
        vp = vec[[where[t] for t in p]]
        vh = vec[[where[t] for t in h]]
        nli[NLI_LABELS[label]] = {
            "overlap": D.lexical_overlap(p, h),
            "cos": np.einsum("ij,ij->i", vp, vh).astype(np.float64),
        }
        counts[label] = len(pick)
    return nli, counts


def _write_figures(
    pairs: dict[str, dict[str, dict[str, np.ndarray]]], cfg: ReportConfig, info: dict[str, Any]
) -> None:
    """Per measure (overlap, cosine): the histograms of every (source, side) series on common
    bins, as ``<plots>/mining_<measure>.csv`` and ``<reports>/mining_<measure>.png``."""
    reports, plots = Path(cfg.reports), Path(cfg.plots)
    plots.mkdir(parents=True, exist_ok=True)
    for measure, low, high, xlabel in (
        ("overlap", 0.0, 1.0, "lexical overlap (shared words / words of the longer sentence)"),
        ("cos", -0.2, 1.0, f"cosine under {model_label(info.get('model'))}"),
    ):
        series = {
            f"{source}_{side}": measures[measure]
            for source, sides in pairs.items()
            for side, measures in sides.items()
        }
        centres, fractions = D.histograms(series, cfg.bins, low, high)
        name = "overlap" if measure == "overlap" else "cosine"
        atomic_write_bytes(plots / f"mining_{name}.csv", D.csv_text(centres, fractions).encode())
        D.plot(
            series,
            reports / f"mining_{name}.png",
            xlabel,
            cfg.bins,
            low,
            high,
            f"{'Lexical overlap' if name == 'overlap' else 'Cosine similarity'} of positive and "
            "negative pairs (DebCSE Figs. 1 and 4)",
        )


def _report_text(
    cfg: ReportConfig,
    summary: dict[str, Any],
    info: dict[str, Any],
    nli_dir: Path | None,
    nli_status: str,
    nli_counts: dict[str, int],
) -> str:
    """``mining.md``: the summary table beside the paper's numbers, where each row's pairs come
    from, the figures, and the pairs to read (``pairs_to_read``)."""
    table = D.markdown_table(summary)
    nli_line = (
        f"SNLI {cfg.nli_split} from `{cfg.nli}`: {nli_counts}"
        if nli_dir is not None
        else f"NLI pairs: {nli_status}."
    )
    return f"""# Mining diagnostics (DebCSE Tables 1 and 4, Figures 1 and 4)

Mean lexical overlap (shared words / words of the longer sentence) and mean cosine, under the
mining encoder `{info.get("model")}` ({info.get("pooling")} pooling), of positive and negative
pairs. Good mined pairs sit between the other two rows: positives with less word overlap than
SimCSE's copies (1.0), negatives with more than random sentences, i.e. hard negatives.

{table}

- mined: {summary["mined"]["positive"]["overlap"]["n"]:,} positive and
  {summary["mined"]["negative"]["overlap"]["n"]:,} negative pairs from `{cfg.pairs}`.
- SimCSE-style: {cfg.simcse_pairs:,} sentences encoded twice with dropout on (positive),
  {cfg.random_pairs:,} random sentence pairs (negative).
- {nli_line}
- Paper column: DebCSE Tables 1 and 4 (BERT-base, wiki1m).

![lexical overlap](mining_overlap.png)
![cosine](mining_cosine.png)

{pairs_to_read(cfg.pairs, cfg.read_anchors, cfg.seed)}"""


@stage_command(STAGE)
def command(cfg: ReportConfig) -> None:
    """Diagnose the mined pairs: lexical overlap and cosine beside SimCSE-style and NLI pairs.

    Every option defaults to the key of the same name in the `report` section of params.yaml.
    """
    run(cfg)
