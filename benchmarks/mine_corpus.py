"""The mining benchmark's corpus (benchmarks/mine.py; also read by benchmarks/edit_throughput.py
and benchmarks/scale_dask.py): the Wikipedia and SNLI sentences of ``$PAIRFORGE_SHARED_DATA``,
then perturbed copies of them, and the inputs both sides of the benchmark start from.

``build_corpus(n)`` is deterministic for a seed: one corpus of 100k is built and every smaller
size is its prefix, so the 10k run is part of the 100k run.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIKI = "corpus/wiki1m_for_simcse.first1280000bytes.txt"
SNLI = "nli/snli_senteval"


def shared_data() -> Path:
    return Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def real_sentences() -> list[str]:
    """Wikipedia (the cut-off last line dropped) then SNLI dev/test sentences, whitespace
    normalised, unique, of 3 words or more, in order."""
    data = shared_data()
    wiki_path = data / WIKI
    if not wiki_path.exists():
        raise SystemExit(f"mine benchmark: {wiki_path} is missing; set PAIRFORGE_SHARED_DATA")
    wiki = wiki_path.read_text().split("\n")[:-1]
    snli = []
    for split in ("dev", "test"):
        for side in ("s1", "s2"):
            snli += (data / f"{SNLI}/{side}.{split}").read_text().splitlines()
    out = dict.fromkeys(" ".join(t.split()) for t in wiki + snli)
    return [t for t in out if len(t.split()) >= 3]


def perturb(text: str, rng: random.Random) -> str:
    """One seeded edit of ``text``: a word dropped (sentences over 3 words), two neighbouring
    words swapped, or a word repeated."""
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


def build_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str | None]]:
    """``n`` unique sentences (real ones first, then perturbed copies) in a seeded shuffle, and
    for each its origin: the text of the real sentence it copies, or None for a real one."""
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


def candidate_pairs(texts: list[str], origin: list[str | None]) -> list[tuple[int, int]]:
    """(anchor row, copy row) for every perturbed copy whose real sentence is in ``texts``:
    the copies pairforge is told are that sentence's augmentations (its positives, kept out of
    its negatives). The peer has no such input."""
    row_of = {t: i for i, t in enumerate(texts)}
    return [(row_of[o], i) for i, o in enumerate(origin) if o is not None and o in row_of]


def texts_digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def write_corpus(path: Path, texts: list[str]) -> None:
    """One sentence a line: the file pairforge's ``ingest`` and the peer's process both read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(t + "\n" for t in texts))
    tmp.replace(path)


def write_candidates(folder: Path, texts: list[str], origin: list[str | None]) -> int:
    """The ``candidates`` dataset (one shard) that ``backtranslate`` would have written, holding
    the perturbed copies as route ``perturb``; ``id`` is the anchor's sentence id as ``ingest``
    computes it (the BLAKE2b-64 of the normalised text, and these texts are normalised).
    Returns the number of candidates."""
    import pyarrow as pa
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter
    from pairforge.pipeline.science.text import sentence_id

    rows = [
        {
            S.ID: sentence_id(texts[anchor]),
            S.CANDIDATE_ID: hashlib.blake2b(f"{anchor}-{copy}".encode(), digest_size=8).hexdigest(),
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
        for anchor, copy in candidate_pairs(texts, origin)
    ]
    writer = DatasetWriter(
        folder,
        S.CANDIDATES,
        stage="bench",
        params={"corpus": texts_digest(texts)},
        fingerprint=f"bench-{texts_digest(texts)}",
    )
    writer.write(0, pa.Table.from_pylist(rows, schema=S.CANDIDATES.schema))
    writer.finalize(1)
    return len(rows)
