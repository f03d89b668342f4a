"""How often a process that read a shard from a store aborts at exit, by how its Parquet decodes.

Not a speed benchmark: a count of exit codes. Starts a real S3-compatible server (moto, loopback),
writes a 3-shard dataset to a bucket, then runs ``--runs`` fresh Python processes per variant, each
unpickling one shard source and reading it, as a Dask worker would:

- ``pairforge``: ``ShardSource.read()`` as shipped (fetched through fsspec, decoded on the reading
  thread: ``DECODE_THREADS`` in pipeline/plumbing/shards.py);
- ``arrow-pool``: the same bytes through the same fsspec filesystem, decoded on Arrow's thread pool
  (``ParquetFile.read(use_threads=True)``, pyarrow's default and pairforge's before).

The variants alternate run by run, so both see the same load; ``--load N`` keeps N busy-loop
processes running meanwhile (the aborts showed under load). Prints a table of exit codes per
variant, the abort rate and the load average at the start and the end.

    python benchmarks/store_exit.py --runs 150 --load 4
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

READ = {
    "pairforge": "t = source.read()",
    "arrow-pool": (
        "import pyarrow as pa, pyarrow.parquet as pq\n"
        "from pairforge.pipeline.plumbing.storage import dataset_path\n"
        "data = (dataset_path(source.folder) / source.shard['file']).read_bytes()\n"
        "t = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=True)"
    ),
}


def _script(variant: str) -> str:
    return (
        "import pickle, sys\n"
        "source = pickle.loads(sys.stdin.buffer.read())\n"
        f"{READ[variant]}\n"
        "print(t.num_rows)\n"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=150, help="processes per variant")
    parser.add_argument("--load", type=int, default=4, help="busy-loop processes meanwhile")
    args = parser.parse_args()

    import boto3
    import pyarrow as pa
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="store-exit-"))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
        "PAIRFORGE_CACHE": str(work / "cache"),
        "PYTHONPATH": str(ROOT),
        "PYTHONFAULTHANDLER": "1",
    }
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="store-exit")

    from pairforge.pipeline.plumbing.schemas import SchemaSpec
    from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset

    spec = SchemaSpec(
        "store_exit",
        1,
        pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.string())]),
        "rows",
    )
    url = "s3://store-exit/team/sentences"
    writer = DatasetWriter(url, spec, stage="store_exit", params={}, fingerprint="f")
    for index in range(3):
        ids = list(range(index * 10, index * 10 + 10))
        writer.write(index, pa.table({"id": ids, "text": [f"row {i}" for i in ids]}), {"rows": 10})
    writer.finalize(3)
    source = pickle.dumps(open_dataset(url, spec, verify=True).sources()[1])

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    counts: dict[str, collections.Counter] = {v: collections.Counter() for v in READ}
    first_abort: dict[str, str] = {}
    start_load, start = _loadavg(), time.perf_counter()
    try:
        for run in range(args.runs):
            for variant in READ:
                done = subprocess.run(
                    [sys.executable, "-c", _script(variant)], input=source, env=env,
                    capture_output=True, cwd=work, timeout=300,
                )  # fmt: skip
                read = done.stdout.decode().split() == ["10"]
                counts[variant][(done.returncode, read)] += 1
                if done.returncode and variant not in first_abort:
                    first_abort[variant] = done.stderr.decode().strip().splitlines()[0]
            if (run + 1) % 25 == 0:
                print(f"{run + 1}/{args.runs} runs per variant, load {_loadavg()}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
        server.stop()
    print(f"\n{args.runs} processes per variant, {args.load} busy loops beside them, "
          f"{time.perf_counter() - start:.0f} s; load average {start_load} at the start, "
          f"{_loadavg()} at the end\n")  # fmt: skip
    print("| variant | runs | exit 0, read | aborted (-6), read | other | abort rate |")
    print("|---|---:|---:|---:|---:|---:|")
    for variant, count in counts.items():
        ok, aborted = count[(0, True)], count[(-6, True)]
        other = sum(count.values()) - ok - aborted
        print(f"| {variant} | {sum(count.values())} | {ok} | {aborted} | {other} | "
              f"{aborted / max(sum(count.values()), 1):.1%} |")  # fmt: skip
    for variant, line in first_abort.items():
        print(f"\nfirst failure's stderr ({variant}): {line}")


if __name__ == "__main__":
    main()
