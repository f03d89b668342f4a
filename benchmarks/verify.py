"""The cost of verifying what stages read against the manifest, in seconds per GB.

    python benchmarks/verify.py [--gb 1.0] [--read-gb 0.1] [--repeats 3] [--folder DIR]

1. Checksums alone over the same bytes in memory (1 GB by default, 8 MB updates): sha256,
   blake2b, xxh3_128 (what reads verify) and xxh64.
2. Two real datasets written with ``DatasetWriter``: embeddings (float32 vectors, 384-d: the
   largest datasets a run reads, incompressible) of ``--read-gb`` GB, and sentences (zstd
   text) of a quarter of that. Each is read five ways, files in the page cache, the best of
   ``--repeats`` rounds (the ways interleaved in each). The baseline decodes each shard as
   pairforge does, without the check: ``open_parquet(path).read(use_threads=DECODE_THREADS)``
   (on the calling thread, no pre-buffering), so that it differs from a verified read by the
   check alone. Then ``read_verified_shard`` the first time (the file's bytes hashed while read
   into memory, then decoded from that buffer: one pass), and again once the file is old enough
   to be trusted (hashed once per process). For reference, two reads with pyarrow's defaults
   (Arrow's thread pool decodes the columns): ``pq.ParquetFile(path).read()`` (what
   ``Dataset.read_shard`` did before verified reads) and ``pq.read_table``.

Seconds per GB are of bytes on disk; the overhead is against the baseline. Prints the 1-minute
load average before and after, and Arrow's thread count: the numbers depend on the machine and
on what else runs on it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pairforge.pipeline.plumbing import integrity, shards
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.files import DECODE_THREADS, open_parquet
from pairforge.pipeline.plumbing.integrity import read_verified_shard
from pairforge.pipeline.plumbing.shards import DatasetWriter


def checksum_rates(gb: float) -> list[tuple[str, float]]:
    data = np.random.default_rng(0).integers(0, 256, size=int(gb * 1e9), dtype=np.uint8)
    view = memoryview(data.data)
    rows = []
    for name, make in [
        ("sha256", hashlib.sha256),
        ("blake2b", hashlib.blake2b),
        ("xxh3_128", xxhash.xxh3_128),
        ("xxh64", xxhash.xxh64),
    ]:
        start = time.perf_counter()
        digest = make()
        for i in range(0, len(view), 8 << 20):
            digest.update(view[i : i + (8 << 20)])
        digest.hexdigest()
        rows.append((name, (time.perf_counter() - start) / gb))
    return rows


def embeddings(folder: Path, gb: float, dim: int = 384, shard_mb: int = 128) -> Path:
    spec = S.embeddings_spec(dim, "float32")
    rows = shard_mb * 1_000_000 // (4 * dim)
    n_shards = max(1, round(gb * 1000 / shard_mb))
    writer = DatasetWriter(folder, spec, stage="bench", params={}, fingerprint="bench")
    rng = np.random.default_rng(1)
    for i in range(n_shards):
        vectors = rng.standard_normal((rows, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        table = pa.table(
            {
                S.ID: pa.array([f"{i:06d}{r:010x}" for r in range(rows)]),
                S.VECTOR: pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim),
            }
        )
        writer.write(i, table)
    writer.finalize(n_shards)
    return folder


def sentences(folder: Path, gb: float, shard_rows: int = 400_000) -> Path:
    rng = np.random.default_rng(2)
    vocab = pa.array([f"w{i}" for i in range(30_000)])
    writer = DatasetWriter(folder, S.SENTENCES, stage="bench", params={}, fingerprint="bench")
    index, written = 0, 0
    while written < gb * 1e9:
        words = vocab.take(pa.array(rng.zipf(1.3, size=shard_rows * 14) % 30_000))
        texts = pa.compute.binary_join_element_wise(
            *[words[k::14] for k in range(14)], pa.scalar(" ")
        )
        table = pa.table(
            {
                S.ID: pa.array([f"{index:06d}{r:010x}" for r in range(shard_rows)]),
                S.TEXT: texts,
                S.SOURCE: pa.array(["bench.txt"] * shard_rows),
                S.LINE: pa.array(np.arange(shard_rows, dtype=np.int64)),
            }
        )
        written += writer.write(index, table).bytes
        index += 1
    writer.finalize(index)
    return folder


def read_rates(folder: Path, repeats: int) -> tuple[float, list[tuple[str, float]]]:
    manifest = shards.read_manifest(folder)
    total = sum(s["bytes"] for s in manifest["shards"]) / 1e9
    label = str(folder)
    old = time.time() - 60  # old enough to be trusted once checked (see RACY_SECONDS)
    for shard in manifest["shards"]:
        os.utime(folder / shard["file"], (old, old))
        (folder / shard["file"]).read_bytes()  # page cache warm for every row

    def timed(fn) -> float:
        start = time.perf_counter()
        for shard in manifest["shards"]:
            fn(shard)
        return (time.perf_counter() - start) / total

    def first(shard: dict) -> None:
        integrity._verified.clear()
        read_verified_shard(folder, shard, label, "bench")

    ways = {
        "pairforge's decode (no check)": lambda s: open_parquet(folder / s["file"]).read(
            use_threads=DECODE_THREADS
        ),
        "verified, first read": first,
        "verified, already checked": lambda s: read_verified_shard(folder, s, label, "bench"),
        "ParquetFile.read, Arrow threads (no check)": lambda s: pq.ParquetFile(
            folder / s["file"]
        ).read(),
        "pq.read_table, Arrow threads (no check)": lambda s: pq.read_table(folder / s["file"]),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(repeats):
        for name, fn in ways.items():
            best[name] = min(best[name], timed(fn))
    return total, list(best.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="bytes for the checksum rates")
    parser.add_argument("--read-gb", type=float, default=0.1, help="embeddings dataset size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/pairforge-verify-bench"))
    args = parser.parse_args()
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
    print(
        f"Arrow's CPU threads: {pa.cpu_count()}; pairforge decodes with threads: {DECODE_THREADS}"
    )
    print(f"\nchecksums over {args.gb:g} GB in memory")
    print("| checksum | s/GB | GB/s | vs sha256 |\n|---|---|---|---|")
    rates = checksum_rates(args.gb)
    for name, rate in rates:
        print(f"| {name} | {rate:.3f} | {1 / rate:.2f} | {rates[0][1] / rate:.1f}x |")
    shutil.rmtree(args.folder, ignore_errors=True)
    datasets = [
        ("embeddings float32 384-d", embeddings(args.folder / "embeddings", args.read_gb)),
        ("sentences zstd", sentences(args.folder / "sentences", args.read_gb / 4)),
    ]
    for name, folder in datasets:
        total, rows = read_rates(folder, args.repeats)
        base = rows[0][1]
        n_shards = len(shards.read_manifest(folder)["shards"])
        print(f"\n{name}: {total:.3f} GB on disk, {n_shards} shards")
        print("| read | s/GB | vs pairforge's decode, no check |\n|---|---|---|")
        for what, rate in rows:
            print(f"| {what} | {rate:.3f} | {rate - base:+.3f} s/GB ({rate / base - 1:+.0%}) |")
    shutil.rmtree(args.folder, ignore_errors=True)
    print(f"\nload average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
