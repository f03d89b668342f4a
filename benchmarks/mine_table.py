"""The mining benchmark's arithmetic and tables (benchmarks/mine.py), pure: no process is run
here (tests/benchmarks/test_mine.py).

A *run* is one measured repeat, a dict: ``n`` (sentences), ``system`` (``pairforge`` or
``peer``), ``variant`` (the peer's ``torch`` or ``faiss`` search; ``""`` for pairforge),
``env`` (``defaults`` or ``pairforge``: the thread environment), ``repeat``, ``seconds`` (wall
time of the whole process, or of pairforge's stage processes together), ``peak_mib`` (peak
RSS), pairforge's ``stages`` (stage -> ``seconds``, ``peak_mib``), ``load_before`` and
``load_after`` (1/5/15-minute load averages) and ``key`` (what the figure was measured under).
"""

from __future__ import annotations

import statistics
from typing import Any

STAGES = ("ingest", "embed", "mine", "sample")
TIME_TARGETS = {"defaults": 0.5, "pairforge": 0.8}  # issue 16: pairforge / peer, per peer env
MEMORY_TARGET = 0.6
PEER_LABELS = {
    "torch": "sentence-transformers `mine_hard_negatives` (use_faiss=False, its default)",
    "faiss": "sentence-transformers `mine_hard_negatives` (use_faiss=True)",
}
ENV_LABELS = {"defaults": "its defaults", "pairforge": "pairforge's (OMP_WAIT_POLICY=PASSIVE)"}


def spread(values: list[float]) -> dict[str, float]:
    """Median, lowest and highest of ``values`` (at least one) and how many."""
    return {
        "median": float(statistics.median(values)),
        "low": float(min(values)),
        "high": float(max(values)),
        "n": len(values),
    }


def pairforge_total(stages: dict[str, dict[str, float]]) -> dict[str, float]:
    """One pairforge repeat from its stage processes, run one after the other: the wall time
    is their sum, the peak memory the largest stage's."""
    return {
        "seconds": sum(s["seconds"] for s in stages.values()),
        "peak_mib": max(s["peak_mib"] for s in stages.values()),
    }


def reusable(stored: list[dict], key: str, n: int, once_above: int | None) -> list[dict]:
    """The stored runs of ``key`` that a rerun keeps instead of measuring again: only the
    peer's, and only above ``once_above`` sentences (the peer measured once there)."""
    if once_above is None or n <= once_above:
        return []
    return [r for r in stored if r["key"] == key and r["system"] == "peer"]


def _ratio(ours: list[float], theirs: list[float]) -> dict[str, float]:
    """Median over median, and the widest range the repeats allow (best / worst and worst /
    best)."""
    return {
        "median": statistics.median(ours) / statistics.median(theirs),
        "low": min(ours) / max(theirs),
        "high": max(ours) / min(theirs),
    }


def compare(ours: list[dict], peer: list[dict], env: str) -> dict[str, Any]:
    """pairforge against one peer setting: time and memory ratios and their targets, met when
    the median ratio is at or under the target."""
    time = _ratio([r["seconds"] for r in ours], [r["seconds"] for r in peer])
    memory = _ratio([r["peak_mib"] for r in ours], [r["peak_mib"] for r in peer])
    target = TIME_TARGETS[env]
    return {
        "time": time,
        "memory": memory,
        "time_target": target,
        "memory_target": MEMORY_TARGET,
        "time_met": time["median"] <= target,
        "memory_met": memory["median"] <= MEMORY_TARGET,
    }


def group(runs: list[dict]) -> dict[tuple[int, str, str, str], list[dict]]:
    """Runs by (n, system, variant, env), in the order first seen."""
    out: dict[tuple[int, str, str, str], list[dict]] = {}
    for r in runs:
        out.setdefault((r["n"], r["system"], r["variant"], r["env"]), []).append(r)
    return out


def _cell(s: dict[str, float], digits: int = 1) -> str:
    if s["n"] == 1:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['low']:.{digits}f}-{s['high']:.{digits}f})"


def _loads(rs: list[dict]) -> str:
    one = [x for r in rs for x in (r["load_before"][0], r["load_after"][0])]
    return f"{min(one):.1f}-{max(one):.1f}"


def label(system: str, variant: str, env: str) -> str:
    if system == "pairforge":
        return "pairforge `ingest` + `embed` + `mine` + `sample`"
    return f"{PEER_LABELS[variant]}, env {ENV_LABELS[env]}"


def verdict(c: dict[str, Any]) -> str:
    t, m = c["time"], c["memory"]
    ok_t = "met" if c["time_met"] else "NOT met"
    ok_m = "met" if c["memory_met"] else "NOT met"
    return (
        f"time {t['median']:.2f}x ({t['low']:.2f}-{t['high']:.2f}; target <= "
        f"{c['time_target']}x: {ok_t}), peak memory {m['median']:.2f}x "
        f"({m['low']:.2f}-{m['high']:.2f}; target <= {c['memory_target']}x: {ok_m})"
    )


def markdown(runs: list[dict]) -> str:
    """The benchmark's tables: every system's wall time and peak memory (median (range) over
    its repeats, with the 1-minute load average seen around them), pairforge's stages, and
    pairforge against each peer setting with the verdicts."""
    groups = group(runs)
    lines = [
        "| sentences | system | repeats | wall s, median (range) | peak MiB, median (range) "
        "| load (1 min) |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for (n, system, variant, env), rs in groups.items():
        reused = " (stored)" if any(r.get("reused") for r in rs) else ""
        lines.append(
            f"| {n:,} | {label(system, variant, env)}{reused} | {len(rs)} "
            f"| {_cell(spread([r['seconds'] for r in rs]))} "
            f"| {_cell(spread([r['peak_mib'] for r in rs]), 0)} | {_loads(rs)} |"
        )
    lines += ["", "| sentences | pairforge stage | wall s, median (range) | peak MiB |"]
    lines.append("|---:|---|---:|---:|")
    for (n, system, _, _), rs in groups.items():
        if system != "pairforge":
            continue
        for stage in STAGES:
            seconds = spread([r["stages"][stage]["seconds"] for r in rs])
            peak = spread([r["stages"][stage]["peak_mib"] for r in rs])
            lines.append(f"| {n:,} | `{stage}` | {_cell(seconds)} | {_cell(peak, 0)} |")
    lines += ["", "pairforge / peer (median over median; range: best and worst repeats):", ""]
    for (n, system, variant, env), rs in groups.items():
        ours = groups.get((n, "pairforge", "", "defaults"))
        if system != "peer" or not ours:
            continue
        lines.append(
            f"- {n:,} sentences, vs {label(system, variant, env)}: {verdict(compare(ours, rs, env))}"
        )
    return "\n".join(lines) + "\n"
