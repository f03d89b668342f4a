"""Benchmark: backtranslate throughput (sentences/s), end to end, per engine, against a naive loop.

Model: the opus-mt-en-de architecture (MarianMT, d_model 512, 6+6 layers, 8 heads, FFN 2048,
vocabulary 58,101, sinusoidal positions) with random weights, seeded. Its tokenizer is a
sentencepiece model trained on the corpus, padded with filler entries to the full vocabulary; a
-1e4 logit bias on the fillers keeps outputs to real pieces, so a pivot re-tokenises to about as
many tokens as it has. Every output is exactly ``--length`` tokens long (min = max length), so
every engine does the same decoding work. Corpus: the first ``--sentences`` Wikipedia sentences
of ../shared/data/corpus (one sentences dataset, one shard), round trip en -> de -> en.

Cases, each in a fresh child process (timed from the start of the stage's ``run``, which
includes loading the model, tokenising, batching, translating both legs, detokenising, scoring
and writing the candidates dataset):

* ``stage transformers <dtype>``: the stage on the transformers engine;
* ``stage ctranslate2 <type>``: the stage on CTranslate2 (the one-off conversion, done before
  and reported separately, is not timed; the stage reuses it like every later run);
* ``naive loop``: the baseline users write: batches of 16 in corpus order, tokenizer padding,
  ``model.generate`` (greedy, the same fixed length), ``batch_decode``, both legs, one Parquet
  file written at the end. No sorting, no dedup, no cache.

* ``stage apertium <route>``: the stage on the Apertium engine (real rule-based translation,
  Debian's packages), one route at a time (en-es-en, en-ca-en, en-eo-en), on the same sentences:
  one long-lived pipeline per mode fed ``--apertium-batch`` sentences a batch (the stage's way),
  and for en-es-en also one pipeline process per batch of 64 (the alternative it was chosen
  over). Apertium's outputs have their own length, not ``--length``: its rows time real work,
  not the same decoding work as the Marian rows.

Peak memory is the largest resident set of the case's whole process tree (the child and every
program it started, Apertium's pipelines included), sampled every 20 ms.

The translation cache is off (``cache: null``) in every case: this measures translation, not
cache hits. Targets on the 2-core CPU: CTranslate2 int8 >= 1.8x transformers float32 and >= 2x
the naive loop. On a GPU the cases are float16/int8_float16 as well.

    python benchmarks/backtranslate.py [--sentences 64] [--length 24] [--quick] [--device auto]
    python benchmarks/backtranslate.py --sentences 2000 --engines apertium   # Apertium alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
WIKI = SHARED / "corpus" / "wiki1m_for_simcse.first1280000bytes.txt"
VOCAB = 58101

CHILD_STAGE = r"""
import json, sys, time
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.stages.backtranslate.stage import BacktranslateConfig, run
work, engine, compute_type, device, length, threads, name = sys.argv[1:8]
cfg = BacktranslateConfig(
    input=f"{work}/sentences", output=f"{work}/out-{name}", metrics=f"{work}/out-{name}.json",
    plot=f"{work}/out-{name}.png", cache=None, models_dir=f"{work}/ct2", engine=engine,
    compute_type=compute_type, device=device, threads=int(threads), min_length=int(length),
    max_length=int(length), max_length_ratio=None, max_batch_tokens=4096, max_batch_sentences=64,
    routes=[{"name": "en-de-en", "forward": f"{work}/model", "backward": f"{work}/model"}],
    noise={"copies": 0},
)
"""


CHILD_APERTIUM = r"""
import json, sys, time
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.stages.backtranslate import apertium
from pairforge.stages.backtranslate.stage import BacktranslateConfig, run
work, route, forward, backward, batch, persistent, name = sys.argv[1:8]
if persistent == "0":  # one pipeline process per batch
    apertium.ApertiumPipeline.__init__.__defaults__ = (False,)
cfg = BacktranslateConfig(
    input=f"{work}/sentences", output=f"{work}/out-{name}", metrics=f"{work}/out-{name}.json",
    plot=f"{work}/out-{name}.png", cache=None, engine="apertium", max_batch_sentences=int(batch),
    routes=[{"name": route, "forward": forward, "backward": backward}], noise={"copies": 0},
)
"""

# The stage's run, timed from the start of ``run``, after a case's ``cfg`` is built.
TIMED_RUN = r"""
start = time.perf_counter()
metrics = run(cfg, LocalExecutor(), progress=False)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "sentences": metrics["sentences_in"],
                  "candidates": metrics["candidates_out"],
                  "translated": metrics["translations"]["performed"]}))
"""
CHILD_STAGE += TIMED_RUN
CHILD_APERTIUM += TIMED_RUN
APERTIUM_ROUTES = {
    "en-es-en": ("apertium:eng-spa", "apertium:spa-eng"),
    "en-ca-en": ("apertium:eng-cat", "apertium:cat-eng"),
    "en-eo-en": ("apertium:en-eo", "apertium:eo-en"),
}

CHILD_NAIVE = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
start = time.perf_counter()
import torch, pyarrow as pa, pyarrow.parquet as pq
from transformers import MarianMTModel, MarianTokenizer
work, device, length, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
torch.set_num_threads(threads)
tok = MarianTokenizer.from_pretrained(f"{work}/model")
model = MarianMTModel.from_pretrained(f"{work}/model").to(device).eval()
texts = pq.read_table(f"{work}/sentences")["text"].to_pylist()
def translate(batch):
    enc = tok(batch, return_tensors="pt", padding=True, truncation=True).to(device)
    with torch.no_grad():
        out = model.generate(**enc, num_beams=1, do_sample=False, min_new_tokens=length,
                             max_new_tokens=length)
    return tok.batch_decode(out, skip_special_tokens=True)
pivots, back = [], []
for i in range(0, len(texts), 16):
    pivots += translate(texts[i:i + 16])
for i in range(0, len(pivots), 16):
    back += translate(pivots[i:i + 16])
pq.write_table(pa.table({"text": texts, "pivot": pivots, "candidate": back}), f"{work}/naive.parquet")
print(json.dumps({"seconds": time.perf_counter() - start, "sentences": len(texts),
                  "candidates": len(back), "translated": 2 * len(texts)}))
"""


def build(work: Path, n: int) -> None:
    """The random opus-mt-en-de-sized model and a one-shard sentences dataset of ``n`` rows."""
    import pyarrow as pa
    import torch
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter
    from pairforge.pipeline.science.text import sentence_ids
    from pairforge.stages.standin.marian import marian_vocab, train_vocabulary, write_tokenizer
    from transformers import MarianConfig, MarianMTModel

    lines = [" ".join(x.split()) for x in WIKI.read_text(encoding="utf-8").splitlines()]
    lines = [x for x in dict.fromkeys(lines) if 4 <= len(x.split()) <= 40]
    texts = lines[:n]
    spm_model = train_vocabulary(lines[:5000], 8000)
    vocab = marian_vocab(spm_model)
    pad = vocab.pop("<pad>")
    real = len(vocab)
    for i in range(VOCAB - 1 - len(vocab)):
        vocab[f"\u2581filler{i}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    assert pad and len(vocab) == VOCAB
    write_tokenizer(work / "model", spm_model, vocab)
    config = MarianConfig(
        vocab_size=VOCAB,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias[:, real:] = -1e4  # outputs stay real pieces (see docstring)
    model.save_pretrained(work / "model")
    ids, _ = sentence_ids(texts)
    writer = DatasetWriter(
        work / "sentences", S.SENTENCES, stage="bench", params={}, fingerprint=f"bench-{n}"
    )
    writer.write(
        0,
        pa.table(
            {
                S.ID: pa.array(ids, pa.string()),
                S.TEXT: pa.array(texts, pa.string()),
                S.SOURCE: pa.array(["wiki"] * len(texts), pa.string()),
                S.LINE: pa.array(range(1, len(texts) + 1), pa.int64()),
            }
        ),
    )
    writer.finalize(1)


def tree_rss(proc) -> int:
    """Resident bytes of ``proc`` and every process under it (0 once it has gone)."""
    import psutil

    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
    except psutil.Error:
        pass
    return total


def child(code: str, args: list[str]) -> dict:
    """Run one case in a fresh process; its JSON line, with ``peak_mib`` of its process tree."""
    import psutil

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=out, stderr=err, env=env, cwd=ROOT
        )
        watched, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(watched))
            time.sleep(0.02)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{stderr[-3000:]}")
    return {**json.loads(stdout.strip().splitlines()[-1]), "peak_mib": peak / 2**20}


def marian_cases(work: Path, device: str, length: int, threads: int) -> tuple[list, dict]:
    """The Marian cases (naive loop, transformers, CTranslate2) and the one-off conversions."""
    from pairforge.pipeline.science.models.files import (
        convert_ctranslate2,
        resolve_translation_model,
    )

    ref = resolve_translation_model(str(work / "model"))
    ct2_types = ["int8"] if device == "cpu" else ["int8_float16", "float16"]
    conversions = {}
    for ct in ct2_types:
        start = time.perf_counter()
        convert_ctranslate2(ref, ct, str(work / "ct2"))
        conversions[ct] = time.perf_counter() - start
    common = [device, str(length), str(threads)]
    cases = [("naive loop (transformers float32)", CHILD_NAIVE, [str(work), *common])]
    for dt in ["float32"] if device == "cpu" else ["float32", "float16"]:
        args = [str(work), "transformers", dt, *common, f"hf-{dt}"]
        cases.append((f"stage transformers {dt}", CHILD_STAGE, args))
    for ct in ct2_types:
        args = [str(work), "ctranslate2", ct, *common, f"ct2-{ct}"]
        cases.append((f"stage ctranslate2 {ct}", CHILD_STAGE, args))
    return cases, conversions


def apertium_cases(work: Path, batch: int) -> list:
    """Each Apertium route with long-lived pipelines, and en-es-en with a process per batch."""
    cases = []
    for route, (forward, backward) in APERTIUM_ROUTES.items():
        args = [str(work), route, forward, backward, str(batch), "1", f"apertium-{route}"]
        cases.append((f"stage apertium {route}", CHILD_APERTIUM, args))
    forward, backward = APERTIUM_ROUTES["en-es-en"]
    args = [str(work), "en-es-en", forward, backward, "64", "0", "apertium-per-batch"]
    cases.append(("stage apertium en-es-en, process/64", CHILD_APERTIUM, args))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--length", type=int, default=24, help="fixed output tokens per leg")
    parser.add_argument("--threads", type=int, default=0, help="0: every core")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="24 sentences, 16 tokens")
    parser.add_argument(
        "--engines", nargs="+", default=["marian", "apertium"], choices=["marian", "apertium"]
    )
    parser.add_argument(
        "--apertium-batch", type=int, default=1024, help="sentences per Apertium batch"
    )
    args = parser.parse_args()
    if args.quick:
        args.sentences, args.length = 24, 16
    threads = args.threads or len(os.sched_getaffinity(0))
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pairforge-bench-bt-") as tmp:
        work = Path(tmp)
        build(work, args.sentences)
        cases, conversions = [], {}
        if "marian" in args.engines:
            cases, conversions = marian_cases(work, device, args.length, threads)
        if "apertium" in args.engines:
            cases += apertium_cases(work, args.apertium_batch)
        results = {}
        for name, code, cargs in cases:
            results[name] = child(code, cargs)
            print(f"  {name}: {results[name]['seconds']:.1f}s", file=sys.stderr, flush=True)
    load = (*load, *os.getloadavg())
    naive = results.get("naive loop (transformers float32)")
    base_hf = results.get("stage transformers float32")
    print(
        f"\nbacktranslate benchmark: {args.sentences} Wikipedia sentences, one round trip per "
        f"case; Marian rows: en-de-en, {args.length} output tokens per leg, opus-mt-en-de "
        f"architecture (random weights); device {device}, {threads} threads; load average "
        f"{load[0]:.2f} before, {load[3]:.2f} after (1 min)"
    )
    print(
        f"{'case':38} {'seconds':>8} {'sent/s':>8} {'peak MiB':>9} {'vs naive':>9} "
        f"{'vs hf fp32':>11}"
    )
    for name, r in results.items():
        rate = r["sentences"] / r["seconds"]
        vs_naive = f"{naive['seconds'] / r['seconds']:8.2f}x" if naive else f"{'':9}"
        vs_hf = f"{base_hf['seconds'] / r['seconds']:10.2f}x" if base_hf else ""
        print(f"{name:38} {r['seconds']:8.1f} {rate:8.2f} {r['peak_mib']:9.0f} {vs_naive} {vs_hf}")
    for ct, seconds in conversions.items():
        print(f"(one-off CTranslate2 conversion to {ct}: {seconds:.1f}s, cached for later runs)")
    per_batch = results.get("stage apertium en-es-en, process/64")
    if per_batch:
        kept = results["stage apertium en-es-en"]
        print(
            f"apertium en-es-en: long-lived pipelines {per_batch['seconds'] / kept['seconds']:.2f}x "
            "the speed of a pipeline process per batch of 64"
        )
    if device == "cpu" and naive and base_hf:
        ct = results["stage ctranslate2 int8"]
        ok_hf = base_hf["seconds"] / ct["seconds"] >= 1.8
        ok_naive = naive["seconds"] / ct["seconds"] >= 2.0
        print(
            f"targets: ctranslate2 int8 >= 1.8x transformers fp32: {'met' if ok_hf else 'MISSED'}; "
            f">= 2x naive loop: {'met' if ok_naive else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
