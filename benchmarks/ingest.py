"""Benchmark: ingest throughput (rows/s) and peak memory at 100k and 1M rows.

Corpus: the Wikipedia sentences in ../shared/data/corpus/ replicated to N rows; each replica gets
a distinct numeric suffix except 10% of rows left as exact copies, so dedup has real work.
Every measurement runs in a fresh child process (peak RSS = that process's ru_maxrss); the
clock starts after imports, including the pandas import that pyarrow's first cast triggers:

* pairforge in-process (``workers=0``) and on a 2-worker Dask LocalCluster;
* a naive baseline of the kind users write: read lines, normalise each in Python, dedup with a
  set of strings, build one table and write one Parquet file at the end.

Targets on the 2-core CI machine: >= 200k rows/s, and peak memory at 1M <= 1.3x that at 100k.

    python benchmarks/ingest.py [--sizes 100000 1000000] [--workers 0 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
WIKI = SHARED / "corpus" / "wiki1m_for_simcse.first1280000bytes.txt"

CHILD_PAIRFORGE = r"""
import json, resource, sys, time
import pyarrow.pandas_compat  # pyarrow's first cast imports pandas (~0.3 s): a start-up cost, not throughput
from pairforge.pipeline.plumbing.runner import make_executor
from pairforge.stages.ingest.stage import IngestConfig, run
corpus, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = IngestConfig(root=".", inputs=[corpus], output=out + "/sentences", quarantine=out + "/quarantine",
                   metrics=out + "/metrics.json", rows_per_shard=100_000, chunk_rows=50_000)
ex = make_executor(workers)
start = time.perf_counter()
metrics = run(cfg, ex, progress=False)
elapsed = time.perf_counter() - start
ex.close()
print(json.dumps({"seconds": elapsed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "kept": metrics["rows_kept"], "read": metrics["rows_read"]}))
"""

CHILD_NAIVE = r"""
import json, resource, sys, time, unicodedata
import pyarrow as pa, pyarrow.parquet as pq
corpus, out = sys.argv[1], sys.argv[2]
start = time.perf_counter()
seen, texts, read = set(), [], 0
with open(corpus, encoding="utf-8", errors="replace") as fh:
    for line in fh:
        read += 1
        text = " ".join(unicodedata.normalize("NFC", line).split())
        if len(text.split()) < 3 or text in seen:
            continue
        seen.add(text)
        texts.append(text)
pq.write_table(pa.table({"text": texts}), out + "/naive.parquet")
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "kept": len(texts), "read": read}))
"""


def make_corpus(path: Path, rows: int) -> None:
    lines = WIKI.read_text(encoding="utf-8").split("\n")[:-1]  # the last line is cut mid-word
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            base = lines[i % len(lines)]
            fh.write(base + ("\n" if rng.random() < 0.1 else f" ({i // len(lines)})\n"))


def child(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            corpus = Path(tmp) / f"corpus-{size}.txt"
            make_corpus(corpus, size)
            runs = [(f"pairforge workers={w}", CHILD_PAIRFORGE, (str(w),)) for w in args.workers]
            runs.append(("naive baseline", CHILD_NAIVE, ()))
            for name, code, extra in runs:
                out = Path(tempfile.mkdtemp(dir=tmp))
                result = child(code, str(corpus), str(out), *extra)
                rows.append(
                    {"size": size, "name": name, **result, "rows_s": size / result["seconds"]}
                )
                print(
                    f"  {name:<24} {size:>9,} rows  {result['seconds']:7.2f} s  "
                    f"{size / result['seconds']:>10,.0f} rows/s  peak {result['rss_mb']:7.1f} MB",
                    flush=True,
                )

    print("\n| rows | run | seconds | rows/s | peak RSS MB | kept | vs naive (speed) |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        naive = next(x for x in rows if x["size"] == r["size"] and x["name"] == "naive baseline")
        print(
            f"| {r['size']:,} | {r['name']} | {r['seconds']:.2f} | {r['rows_s']:,.0f} | {r['rss_mb']:.0f} | "
            f"{r['kept']:,} | {r['rows_s'] / naive['rows_s']:.2f}x |"
        )
    if len(args.sizes) >= 2:
        small, large = min(args.sizes), max(args.sizes)
        print(f"\nPeak memory ratio {large:,} / {small:,} rows (target <= 1.3 for pairforge):")
        for name in sorted({r["name"] for r in rows}):
            a = next(r for r in rows if r["name"] == name and r["size"] == small)
            b = next(r for r in rows if r["name"] == name and r["size"] == large)
            print(
                f"  {name:<24} {b['rss_mb'] / a['rss_mb']:.2f}x  ({a['rss_mb']:.0f} -> {b['rss_mb']:.0f} MB)"
            )


if __name__ == "__main__":
    main()
