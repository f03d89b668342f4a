"""The quality benchmark's table, pure: the arithmetic over run records (means, paired
differences and their 95% intervals, the targets, the dev choices) and its markdown; no
process is run here (tests/benchmarks/test_quality.py). The runner is benchmarks/quality.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from quality_rows import DEFAULT_ROW, LABELS, NEGATIVE_ROWS, PEER_ROWS, ROWS, TASKS

# Two-sided 95% critical values of Student's t by degrees of freedom (n - 1 seeds); beyond 30,
# the normal's 1.96 is within 0.09 of it.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


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
    rerun with ``--settle-steps``; a settled run and its companion with ``--also-steps``): the
    row's figures take the seed's settled run (:func:`settled_length`), and its difference to
    the baseline pairs runs of equal length only (a seed whose baseline has no run of that
    length is left out of the difference and listed in ``unpaired``); ``diff_settled`` is the
    settled reading (:func:`_per_seed`), its ``mixed`` seeds those paired at unequal lengths."""
    runs: dict[tuple[str, str], dict[int, dict[int, dict]]] = {}
    for r in records:
        runs.setdefault((r["row"], r["start"]), {}).setdefault(int(r["seed"]), {})[r["steps"]] = r
    groups = {key: {seed: by_steps[settled_length(by_steps)] for seed, by_steps in seeds.items()}
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
        lengths = runs[row, start]  # {seed: {steps: record}}
        avgs = {s: {n: r["avg"] for n, r in lengths[s].items()} for s in seeds}
        devs = {s: by_seed[s]["best_dev"] for s in seeds if by_seed[s].get("best_dev") is not None}
        dev_runs = {s: {n: r["best_dev"] for n, r in lengths[s].items()
                        if r.get("best_dev") is not None} for s in devs}  # fmt: skip
        reads = {s: by_seed[s]["steps"] for s in seeds}
        base_avgs = {s: {n: r["avg"] for n, r in by_n.items()} for s, by_n in base_runs.items()}
        base_reads = {s: settled_length(by_n) for s, by_n in base_runs.items()}
        # The settled reading (a settled 500-step run against an unsettled baseline's 1,000-step
        # rerun; a companion only against a row read at its length); ``mixed``: unequal lengths.
        settled, mixed = _per_seed(avgs, base_avgs, "settled", reads, base_reads, lengths_out=True)
        rerun = [s for s in seeds if reads[s] > min(lengths[s])]
        longer = {s: [r for n, r in lengths[s].items() if n > reads[s]] for s in seeds}
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
                "diff_settled": {
                    "seeds": list(settled),
                    "mixed": mixed,
                    **_spread(list(settled.values())),
                },
                "runs": avgs,
                # Each seed's settled length, and its kept dev score at every length it has.
                "reads": reads,
                "dev_runs": dev_runs,
                "best_step": _mean_sd([by_seed[s]["best_step"] for s in seeds])[0],
                # The dev score the run kept (mean over seeds): what a default is chosen by.
                "best_dev": _mean_sd(list(devs.values())),
                # Each seed's kept dev score (its settled run): what a row's dev mean averages.
                "devs": devs,
                "late_best": [s for s in seeds if unsettled_run(by_seed[s])],
                # Seeds with a companion whose own best dev step is late: still paired at its
                # length (the rule reruns a seed's run only until it settles), and listed.
                "late_companion": [s for s, rs in longer.items() if any(map(unsettled_run, rs))],
                # Each seed's kept step and its run's length (the settled run).
                "best_steps": {s: (by_seed[s]["best_step"], by_seed[s]["steps"]) for s in seeds},
                # Seeds whose run was rerun with more steps, and with how many: because its
                # best dev step was late (``settled``: the length the row is read at), or only
                # to pair at equal length with another row's run of that length, its own run
                # having settled (``companion``: paired at that length, never the row's figures).
                "settled": {s: reads[s] for s in rerun},
                "companion": {s: max(lengths[s]) for s, rs in longer.items() if rs},
                "train_seconds": _mean_sd([by_seed[s]["train_seconds"] for s in seeds])[0],
            }
        )
    return out


def unsettled_run(run: dict[str, Any]) -> bool:
    """Whether a run's best dev step is in the last 20% of its steps (it may not have settled:
    the rule reruns it with more steps before the table is read)."""
    return run["best_step"] > 0.8 * run["steps"]


def settled_length(by_steps: dict[int, dict[str, Any]]) -> int:
    """The length a seed's runs ({steps: record}) are read at: the shortest that settled (the
    rule reruns a run only while it has not, each time longer), else the longest. A longer run
    of a settled seed is a companion (``--also-steps``), made to pair at equal length with a
    row read at that length: it never stands in for the settled run against another row."""
    return next((n for n in sorted(by_steps) if not unsettled_run(by_steps[n])), max(by_steps))


def _per_seed(a, b, lengths: str, a_reads=None, b_reads=None, *, lengths_out: bool = False):
    """``a``'s average minus ``b``'s ({seed: {steps: avg}}) on the seeds both have, by seed.
    ``lengths``: ``equal`` pairs runs of the same length (the longest both have; a seed without
    one is left out); ``settled``, the settled reading, each seed's settled runs (``a_reads``,
    ``b_reads``: {seed: length}, as :func:`settled_length`), at the longer of the two lengths
    where both rows have a run of it (a companion's use), else each at its own length.
    ``lengths_out``: also return the seeds paired at unequal lengths."""
    out: dict[int, float] = {}
    mixed: list[int] = []
    for seed in sorted(set(a) & set(b)):
        ra, rb = a[seed], b[seed]
        if lengths == "settled":
            la, lb = a_reads[seed], b_reads[seed]
            n = max(la, lb)
            la, lb = (n, n) if n in ra and n in rb else (la, lb)
            out[seed] = ra[la] - rb[lb]
            if la != lb:
                mixed.append(seed)
        elif common := set(ra) & set(rb):
            out[seed] = ra[max(common)] - rb[max(common)]
    return (out, mixed) if lengths_out else out


def _spread(diffs: list[float]) -> dict[str, Any]:
    """Differences seed by seed with their mean, sd and 95% interval (t over seeds)."""
    mean, sd = _mean_sd(diffs)
    return {"per_seed": diffs, "mean": mean, "sd": sd, "ci95": interval(diffs)}


def mixed_lengths(summary: list[dict[str, Any]]) -> bool:
    """Whether the settled reading differs from the equal-length Δ for some row: a settled run
    of a seed paired with a baseline run of another length, or a companion paired at its length
    where Δ pairs the settled run (the table then reads the differences both ways)."""
    return any(
        s["diff_settled"]["mixed"] or s["diff_settled"]["per_seed"] != s["diff"]["per_seed"]
        for s in summary
    )


def paired(a: dict[str, Any], b: dict[str, Any], lengths: str = "equal") -> dict[str, Any]:
    """Row ``a``'s average minus row ``b``'s, seed by seed on the seeds both have (see
    :func:`_per_seed` for ``lengths``: ``equal`` or ``settled``, the settled reading): the
    differences, their number, mean, sd and 95% interval (t over seeds)."""
    diffs = list(_per_seed(a["runs"], b["runs"], lengths, a["reads"], b["reads"]).values())
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
    ``lengths``: as :func:`paired` (runs of equal length, or the settled reading)."""
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


def dev_versus_default(row: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """``row``'s kept dev score minus the default's, seed by seed on the seeds both have (the
    settled reading, as :func:`_per_seed`), with mean, sd and 95% interval, and the rule's
    verdict: ``replaces`` only when the interval is above 0 (docs/quality.md, "Choosing
    defaults on dev"); one seed, or an interval reaching 0, leaves the default in place."""
    diffs = _per_seed(row["dev_runs"], default["dev_runs"], "settled", row["reads"],
                      default["reads"])  # fmt: skip
    d = _spread(list(diffs.values()))
    d["n"] = len(diffs)
    d["replaces"] = d["ci95"] is not None and d["ci95"][0] > 0
    return d


def dev_table(summary: list[dict[str, Any]], start: str = "cls") -> list[str]:
    """The negatives rows of one start ranked by their kept dev score (mean over seeds): what
    a default is chosen by, as markdown table lines, best first (none when no row has a dev
    score). Each row: its seeds, dev mean ± sd, its paired dev difference to the default
    (``DEFAULT_ROW``) with the rule's verdict (:func:`dev_versus_default`), test mean ± sd, its
    paired test difference to the peer's best setting by dev, and the seeds that have not
    settled (best step / steps of the run read). Differences are the settled reading
    (:func:`_per_seed`) over the seeds both rows have; one seed gives the difference alone, no
    interval."""
    rows = [s for s in summary if s["start"] == start and s["row"] in NEGATIVE_ROWS]
    rows = [s for s in rows if s["best_dev"][0] is not None]
    if not rows:
        return []
    rows.sort(key=lambda s: -s["best_dev"][0])
    by_row = {s["row"]: s for s in rows}
    default = by_row.get(DEFAULT_ROW)
    peer = _by_dev(by_row, PEER_ROWS)
    lines = [
        "| row | negatives | seeds | dev | dev - default, paired [95%] | verdict | test | "
        f"test - {peer or 'the peer'}, paired [95%] | not settled (best/steps) |",
        "|---|---|---|---:|---:|---|---:|---:|---|",
    ]
    for s in rows:
        label = ROWS[s["row"]].label.removeprefix("+ ")
        if s is default:
            label += " (**the default**)"
        dev, verdict = "", ""
        if default is not None and s is not default:
            d = dev_versus_default(s, default)
            if d["n"]:
                dev = _pm(d["mean"], None, signed=True) + _ci(d["ci95"])
                verdict = "replaces the default" if d["replaces"] else "not separated"
        test = ""
        if peer is not None and s["row"] != peer:
            d = paired(s, by_row[peer], "settled")
            test = "" if d["mean"] is None else _pm(d["mean"], None, signed=True) + _ci(d["ci95"])
        late = ", ".join(f"{seed} ({s['best_steps'][seed][0]}/{s['best_steps'][seed][1]})"
                         for seed in s["late_best"])  # fmt: skip
        cells = [f"`{s['row']}`", label, ", ".join(map(str, s["seeds"])),
                 _pm(*s["best_dev"]), dev, verdict, _pm(*s["avg"]), test, late or "-"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _pm(mean: float | None, sd: float | None, signed: bool = False) -> str:
    if mean is None:
        return ""
    m = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return m if sd is None else f"{m} ± {sd:.2f}"


def markdown(
    summary: list[dict[str, Any]], untrained: dict[str, dict], settings: dict[str, Any]
) -> str:
    """The docs-ready table: untrained starts, then every (row, start)."""
    # Where a seed's settled run is paired with a baseline run of another length, a second Δ.
    mixed = mixed_lengths(summary)
    head = ["row", "start", "seeds", *(LABELS[t] for t in TASKS), "Avg.", "Δ vs SimCSE (paired)"]
    head += ["Δ, settled runs"] if mixed else []
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
        diffs = [d, s["diff_settled"]] if mixed else [d]
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
    beside = [f"{s['row']}/{s['start']} seeds {s['companion']}" for s in summary
              if s.get("companion")]  # fmt: skip
    if beside:
        note += (
            "\n\nRun with more steps beside another row's run of that length, to pair at equal "
            "length (their own run had settled: the row's figures keep it; the longer run is "
            "paired only with a row read at its length): " + "; ".join(beside)
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
            "\n\nΔ, settled runs: each seed's settled run against SimCSE's settled run of the "
            "same seed, at the longer of their lengths where both have a run of it, else "
            "whatever their lengths (a rerun has its own schedule: the linear decay over its "
            "steps); seeds of unequal lengths: "
            + "; ".join(
                f"{s['row']}/{s['start']} {s['diff_settled']['mixed']}"
                for s in summary
                if s["diff_settled"]["mixed"]
            )
        )
    late = [f"{s['row']}/{s['start']} seeds {s['late_best']}" for s in summary if s["late_best"]]
    if late:
        note += (
            "\n\nBest dev step in the last 20% of the steps (the curve may not have settled; "
            "rerun with more --steps): " + "; ".join(late)
        )
    late = [f"{s['row']}/{s['start']} seeds {s['late_companion']}" for s in summary
            if s.get("late_companion")]  # fmt: skip
    if late:
        note += (
            "\n\nCompanions whose best dev step is in the last 20% of their steps (paired at "
            "their length all the same; the pair may not have settled): " + "; ".join(late)
        )
    return "\n".join(lines) + "\n\n" + note + "\n"
