"""How far another machine's last bits move the mined pairs: `sample`'s two draw schemes compared.

    python benchmarks/draw_stability.py --folder RUN/pipeline-apertium --out /tmp/stability

Two machines that mine the same inputs with the same package can still disagree in the last bits
of the embeddings (another CPU's kernels sum in another order). The pools of a few anchors then
differ (a neighbour in or out at the band's edge or the pool's cap, two near-equal cosines in the
other order), and what that does to the pairs depends on how `sample` draws. This benchmark
stands in for the other machine: it moves the stored embeddings (sentences and candidates) by
one ulp in a fraction of their components, or by a relative Gaussian error on every component,
mines the pools again from them (the profile's pools and the knn pools of benchmarks/quality.py),
samples each with ``draws: stream`` (one generator per shard and anchor batch) and ``draws:
keyed`` (each candidate's number hashed from its anchor and itself), and counts, against the
same scheme on the unmoved embeddings, the anchors whose pool changed and the rows whose
negatives or positives changed.

``--folder`` is a mined pipeline folder (``params.yaml`` and its ``data/``: sentences,
candidates, embeddings, rewrites), such as the one ``benchmarks/quality.py --mine-only``
leaves. Nothing in it is written: every variant is a folder under ``--out`` whose inputs are
hard links, but for the moved embeddings. What is counted is pairs, not time; the seconds of
each variant are printed for the record only. The table goes to stdout and ``--out``'s
``stability.json`` / ``stability.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml
from pairforge.pipeline.plumbing.files import file_checksums

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_rows import POOLS  # noqa: E402

SAMPLERS = {"uniform": ("--ipw", "uniform"), "calibrated": ("--ipw", "calibrated")}
SCHEMES = ("stream", "keyed")
# name -> (kind, size): "ulp" moves that fraction of the components by one ulp; "rel" multiplies
# every component by 1 + size * N(0, 1).
LEVELS = {"ulp0.1": ("ulp", 0.1), "rel1e-6": ("rel", 1e-6), "rel1e-5": ("rel", 1e-5)}


def move_embeddings(folder: Path, kind: str, size: float, seed: int = 1) -> int:
    """Move every stored vector of ``folder/data/embeddings/{sentences,candidates}`` in place,
    rewriting each shard and its manifest checksums; returns the components moved."""
    rng = np.random.default_rng(seed)
    moved = 0
    for name in ("sentences", "candidates"):
        root = folder / "data/embeddings" / name
        manifest = json.loads((root / "_manifest.json").read_text())
        for i, entry in enumerate(manifest["shards"]):
            path = root / "data" / f"part-{i:05d}.parquet"
            table = pq.read_table(path)
            column = table["vector"].combine_chunks()
            flat = column.values.to_numpy(zero_copy_only=False).astype(np.float32)
            if kind == "ulp":
                hit = rng.random(flat.size) < size
                up = hit & (rng.random(flat.size) < 0.5)
                flat[up] = np.nextafter(flat[up], np.float32(np.inf))
                down = hit & ~up
                flat[down] = np.nextafter(flat[down], np.float32(-np.inf))
                moved += int(hit.sum())
            else:
                noise = 1 + size * rng.standard_normal(flat.size)
                flat = (flat.astype(np.float64) * noise).astype(np.float32)
                moved += flat.size
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat), column.type.list_size)
            table = table.set_column(table.schema.get_field_index("vector"), "vector", vectors)
            codec = pq.read_metadata(path).row_group(0).column(0).compression.lower()
            pq.write_table(table.cast(pq.read_schema(path)), path, compression=codec)
            sha256, xxh3_128, nbytes = file_checksums(path)
            entry.update(bytes=nbytes, sha256=sha256, xxh3_128=xxh3_128)
        (root / "_manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return moved


def variant(source: Path, target: Path, moved: bool) -> None:
    """``target``: ``source``'s params and inputs as hard links (the embeddings copied when
    they are to be moved); no pools, pairs or models."""
    target.mkdir(parents=True)
    shutil.copy(source / "params.yaml", target / "params.yaml")
    for name in ("sentences", "candidates", "rewrites", "embeddings"):
        src = source / "data" / name
        if src.exists():
            copy = shutil.copy2 if (moved and name == "embeddings") else os.link
            shutil.copytree(src, target / "data" / name, copy_function=copy)


def pairforge(args: list[str], cwd: Path) -> None:
    command = [sys.executable, "-m", "pairforge.stages.cli", *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"pairforge {' '.join(args)} failed in {cwd}:\n{result.stderr[-3000:]}")


def mine_and_sample(folder: Path, pools: list[str]) -> None:
    """Mine each pools variant, then sample it with each sampler and draw scheme."""
    base = yaml.safe_load((folder / "params.yaml").read_text())
    for name in pools:
        params = json.loads(json.dumps(base))
        params["mine"].update(
            POOLS[name], output=f"data/pools-{name}", metrics=f"metrics/mine-{name}.json"
        )
        params["sample"]["pools"] = f"data/pools-{name}"
        (folder / f"params-{name}.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        pairforge(["mine", "--params", f"params-{name}.yaml"], folder)
        for sampler, options in SAMPLERS.items():
            for scheme in SCHEMES:
                out = f"data/pairs-{name}-{sampler}-{scheme}"
                params["sample"]["draws"] = scheme
                path = folder / f"params-{name}-{scheme}.yaml"
                path.write_text(yaml.safe_dump(params, sort_keys=False))
                pairforge(
                    ["sample", "--params", path.name, *options, "--output", out,
                     "--metrics", f"metrics/{out.split('/')[-1]}.json"],
                    folder,
                )  # fmt: skip


def read(folder: Path, dataset: str, columns: list[str]) -> pa.Table:
    return ds.dataset(folder / "data" / dataset / "data").to_table(columns=columns).sort_by("id")


def _differing(a: list, b: list) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def compare(base: Path, other: Path, pools: list[str]) -> dict[str, dict[str, int]]:
    """Anchors whose pool changed (as a set, in order, in length) and rows whose draws changed."""
    out: dict[str, dict[str, int]] = {}
    for name in pools:
        a = read(base, f"pools-{name}", ["id", "pool_ids"])["pool_ids"].to_pylist()
        b = read(other, f"pools-{name}", ["id", "pool_ids"])["pool_ids"].to_pylist()
        out[f"pools-{name}"] = {
            "anchors": len(a),
            "set": _differing([set(x) for x in a], [set(y) for y in b]),
            "order": _differing(a, b),
            "length": _differing([len(x) for x in a], [len(y) for y in b]),
        }
        for sampler in SAMPLERS:
            for scheme in SCHEMES:
                dataset = f"pairs-{name}-{sampler}-{scheme}"
                cols = ["id", "negative_ids", "positive_ids"]
                x, y = read(base, dataset, cols), read(other, dataset, cols)
                out[dataset] = {"rows": x.num_rows} | {
                    side: _differing(
                        x[f"{side[:-1]}_ids"].to_pylist(), y[f"{side[:-1]}_ids"].to_pylist()
                    )
                    for side in ("negatives", "positives")
                }
    return out


def table(results: dict[str, dict], pools: list[str]) -> str:
    levels = list(results)
    lines = [
        "| pools | sampler | draws | "
        + " | ".join(f"{lv}: negatives / positives" for lv in levels)
        + " |",
        "|---|---|---|" + "---:|" * len(levels),
    ]
    for name in pools:
        changed = [results[lv][f"pools-{name}"] for lv in levels]
        cells = [f"{c['set']} / {c['order']} / {c['length']}" for c in changed]
        lines.append(
            f"| `{name}` | pools changed (set / order / length) | | " + " | ".join(cells) + " |"
        )
        for sampler in SAMPLERS:
            for scheme in SCHEMES:
                key = f"pairs-{name}-{sampler}-{scheme}"
                cells = [f"{results[lv][key]['negatives']} / {results[lv][key]['positives']}"
                         for lv in levels]  # fmt: skip
                lines.append(f"| `{name}` | {sampler} | {scheme} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="a mined pipeline folder")
    parser.add_argument("--out", type=Path, required=True, help="scratch folder (emptied)")
    parser.add_argument("--levels", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    parser.add_argument("--pools", nargs="+", default=["band", "knn"], choices=list(POOLS))
    args = parser.parse_args()
    if not (args.folder / "params.yaml").exists():
        raise SystemExit(f"{args.folder}: no params.yaml (a mined pipeline folder is needed)")
    shutil.rmtree(args.out, ignore_errors=True)
    print(f"load average {os.getloadavg()}", flush=True)
    t0 = time.perf_counter()
    base = args.out / "base"
    variant(args.folder, base, moved=False)
    mine_and_sample(base, args.pools)
    print(f"base: {time.perf_counter() - t0:.0f} s", flush=True)
    results: dict[str, dict] = {}
    for level in args.levels:
        t0 = time.perf_counter()
        folder = args.out / level
        variant(args.folder, folder, moved=True)
        moved = move_embeddings(folder, *LEVELS[level])
        mine_and_sample(folder, args.pools)
        results[level] = {"components_moved": moved, **compare(base, folder, args.pools)}
        shutil.rmtree(folder)
        print(f"{level}: {moved} components moved, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"load average {os.getloadavg()}")
    text = table(results, args.pools)
    print(text)
    (args.out / "stability.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "stability.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
