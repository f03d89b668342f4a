"""Benchmark: the cost of per-sentence seeded sampling against each engine's own sampler.

Since the fix for resumable sampling, neither engine samples: they give next-token logits and
``stages.backtranslate.sampling`` draws (CTranslate2: ``target_prefix`` + ``return_logits_vocab``,
reusing a greedy continuation's logits while the draws follow it; transformers: a logits
processor under greedy search). This script times, per engine, on one Marian model:

* ``greedy``: the stage's greedy decoding (the reference cost);
* ``engine sampler``: the engine's own sampling as the stage did it before (CTranslate2
  ``sampling_topk``, not reproducible across a resume; ``generate(do_sample=True)``);
* ``seeded sampler``: the stage's sampling now (reproducible per sentence).

The model is any Marian folder (``--model``; e.g. a demo stand-in under
``data/models/standin/opus-mt-zh-en``) or, by default, a tiny random MarianMT built here
(d_model 64, 2+2 layers, vocabulary trained on generated sentences).

    python benchmarks/sampling.py [--model PATH] [--sentences 256] [--threads 1] [--top-k 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sentences(n: int, seed: int = 0) -> list[str]:
    """Generated sentences of 5 to 20 words (the augment tests' vocabulary, not numbered)."""
    from tests.stages.augment_helpers import make_sentences

    return make_sentences(n, seed, lengths=(5, 20), numbered=False)


def tiny_model(folder: Path, texts: list[str]) -> Path:
    """The augment tests' tiny random MarianMT, larger: d_model 64, 4 heads, FFN 128."""
    from tests.stages.augment_helpers import build_tiny_marian

    return build_tiny_marian(
        folder,
        texts,
        d_model=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=256,
    )


def engine_sampler(tr, batch: list[list[int]], top_k: int, max_new: int) -> None:
    """The engine's own sampling, as the stage called it before."""
    if tr.settings.engine == "ctranslate2":
        tokens = [tr.tokenizer.convert_ids_to_tokens(ids) for ids in batch]
        tr.translator.translate_batch(
            tokens, beam_size=1, sampling_topk=top_k, max_decoding_length=max_new
        )
        return
    import torch

    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), tr.pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, ids in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
    torch.manual_seed(0)
    with torch.inference_mode():
        tr.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=True,
            top_k=top_k,
            max_new_tokens=max_new,
            suppress_tokens=[tr.pad_id],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="Marian folder; default: a tiny random one")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs")
    args = parser.parse_args()

    import torch
    from pairforge.pipeline.science.models.files import (
        convert_ctranslate2,
        resolve_translation_model,
    )
    from pairforge.stages.backtranslate.decoding import Decoding
    from pairforge.stages.backtranslate.engines import engine_settings, load_translator

    torch.set_num_threads(args.threads)
    texts = sentences(args.sentences)
    work = Path(tempfile.mkdtemp(prefix="pairforge-sampling-"))
    model = Path(args.model) if args.model else tiny_model(work / "model", sentences(2000, 1))
    ref = resolve_translation_model(str(model))
    greedy, sample = Decoding(), Decoding(strategy="sample", top_k=args.top_k)
    results: dict[str, dict[str, float]] = {}
    for engine, compute_type in (("ctranslate2", "float32"), ("ctranslate2", "int8"),
                                 ("transformers", "float32")):  # fmt: skip
        settings = engine_settings(engine, "cpu", compute_type, args.threads, str(work / "ct2"))
        if engine == "ctranslate2":
            convert_ctranslate2(ref, compute_type, settings.models_dir)
        tr = load_translator(ref, settings)
        ids = sorted(tr.encode(texts, 256), key=len)
        batches = [ids[i : i + args.batch] for i in range(0, len(ids), args.batch)]
        max_new = 2 * max(len(x) for x in ids) + 8
        cases = {
            "greedy": lambda b, tr=tr, m=max_new: tr.translate(b, greedy, m, 0, 0),
            "engine sampler": lambda b, tr=tr, m=max_new: engine_sampler(tr, b, args.top_k, m),
            "seeded sampler": lambda b, tr=tr, m=max_new: tr.translate(b, sample, m, 0, 0),
        }
        name = f"{engine} {compute_type}"
        results[name] = {}
        for case, fn in cases.items():
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                for batch in batches:
                    fn(batch)
                best = min(best, time.perf_counter() - start)
            results[name][case] = round(len(texts) / best, 1)
        r = results[name]
        print(
            f"{name:24s} sentences/s: greedy {r['greedy']:8.1f}  engine sampler "
            f"{r['engine sampler']:8.1f}  seeded sampler {r['seeded sampler']:8.1f}  "
            f"(seeded / engine: {r['seeded sampler'] / r['engine sampler']:.2f}x)",
            flush=True,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
