"""Helpers of the mining stage tests: small real datasets (sentences, candidates, embeddings)
written with the project's own DatasetWriter, and the tiny BERT's vocabulary."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import DatasetWriter, ShardInfo, open_dataset, write_shard
from pairforge.pipeline.science.mining_inputs import VECTOR_ROW_GROUP
from pairforge.pipeline.science.text import sentence_id


def write_vectors(
    writer: DatasetWriter, index: int, table: pa.Table, counts: dict[str, int] | None = None
) -> ShardInfo:
    """Write shard ``index`` of an embeddings dataset in the row groups embed writes."""
    options = {"row_group_size": VECTOR_ROW_GROUP, **writer.write_options}
    return write_shard(writer.path, index, table, writer.spec, writer.name, counts, **options)


WORDS = [
    "the",
    "a",
    "an",
    "one",
    "two",
    "three",
    "river",
    "stone",
    "market",
    "quiet",
    "engine",
    "paper",
    "garden",
    "winter",
    "signal",
    "copper",
    "lantern",
    "orbit",
    "harbor",
    "violet",
    "meadow",
    "thunder",
    "silver",
    "canvas",
    "maple",
    "puzzle",
    "city",
    "train",
    "bank",
    "loan",
    "doctor",
    "patient",
    "storm",
    "rain",
    "village",
    "farmer",
    "harvest",
    "museum",
    "painting",
    "music",
    "song",
    "teacher",
    "student",
    "is",
    "was",
    "were",
    "has",
    "had",
    "will",
    "can",
    "not",
    "never",
    "always",
    "often",
    "big",
    "small",
    "old",
    "new",
    "red",
    "blue",
    "green",
    "walked",
    "ran",
    "opened",
    "closed",
    "built",
    "sold",
    "bought",
    "found",
    "lost",
    "saw",
    "heard",
    "near",
    "far",
    "under",
    "over",
    "with",
    "without",
    "after",
    "before",
    "because",
    "and",
    "or",
    "but",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCT = ['"', ".", ",", "means", "?", "!"]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences over WORDS, 5-14 words each, with paraphrase-like families."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 14))]
        for variant in (words, words[::-1][: len(words) - 1] + ["."]):
            text = " ".join(variant).capitalize() + " ."
            if text not in seen and len(out) < n:
                seen.add(text)
                out.append(text)
    return out


def write_sentences(path: Path, texts: list[str], rows_per_shard: int) -> None:
    w = DatasetWriter(
        path,
        S.SENTENCES,
        stage="ingest",
        params={},
        fingerprint="test",
        rows_per_shard=rows_per_shard,
    )
    n = 0
    for start in range(0, len(texts), rows_per_shard):
        chunk = texts[start : start + rows_per_shard]
        w.write(
            n,
            pa.table(
                {
                    S.ID: [sentence_id(t) for t in chunk],
                    S.TEXT: chunk,
                    S.SOURCE: ["test.txt"] * len(chunk),
                    S.LINE: list(range(start + 1, start + 1 + len(chunk))),
                }
            ),
        )
        n += 1
    w.finalize(n)


ROUTES = (("en-zh-en", "none"), ("en-de-en", "none"), ("en-fr-en", "none"), ("en-zh-en", "mask@1"))


def candidate_rows(ids: list[str], texts: list[str], seed: int = 0) -> list[dict]:
    """Augmentation-like candidates: word swaps and drops per route; about 1 in 8 identical."""
    rng = random.Random(seed)
    rows = []
    for sid, text in zip(ids, texts, strict=True):
        for k, (route, noise) in enumerate(ROUTES):
            words = text.split()
            if rng.random() < 0.875 and len(words) > 3:
                i = rng.randrange(len(words) - 2)
                words[i], words[i + 1] = words[i + 1], words[i]
                del words[rng.randrange(len(words) - 1)]
            cand = " ".join(words)
            cid = hashlib.blake2b(f"{sid}|{route}|{noise}|{k}".encode(), digest_size=8).hexdigest()
            rows.append(
                {
                    S.ID: sid,
                    S.CANDIDATE_ID: cid,
                    S.TEXT: cand,
                    S.ROUTE: route,
                    S.ENGINE: "transformers",
                    S.MODEL: "test/a+test/b",
                    S.DECODING: "greedy",
                    S.NOISE: noise,
                    S.NOISED_TEXT: text,
                    S.PIVOT: None,
                    S.IDENTICAL: cand == text,
                    S.LENGTH_RATIO: len(cand) / len(text),
                    S.EDIT_RATIO: 0.1,
                }
            )
    return rows


def write_candidates(path: Path, rows: list[dict], rows_per_shard: int) -> None:
    w = DatasetWriter(
        path,
        S.CANDIDATES,
        stage="backtranslate",
        params={},
        fingerprint="test",
        rows_per_shard=rows_per_shard,
    )
    n = 0
    for start in range(0, len(rows), rows_per_shard):
        w.write(
            n,
            pa.Table.from_pylist(rows[start : start + rows_per_shard], schema=S.CANDIDATES.schema),
        )
        n += 1
    w.finalize(n)


def write_embeddings(
    path: Path, ids: list[str], vectors: np.ndarray, shard_rows: list[int], info: dict | None = None
) -> None:
    """An embeddings dataset as the embed stage writes it (shards of ``shard_rows`` rows)."""
    shutil.rmtree(path, ignore_errors=True)
    dim = vectors.shape[1]
    info = info or {
        "model": "test",
        "pooling": "mean",
        "prompt": None,
        "max_length": 32,
        "dim": dim,
    }
    w = DatasetWriter(path, S.embeddings_spec(dim), stage="embed", params={}, fingerprint="test")
    start = 0
    for i, rows in enumerate(shard_rows):
        flat = pa.array(vectors[start : start + rows].ravel(), pa.float32())
        write_vectors(
            w,
            i,
            pa.table(
                {
                    S.ID: ids[start : start + rows],
                    S.VECTOR: pa.FixedSizeListArray.from_arrays(flat, dim),
                }
            ),
        )
        start += rows
    w.finalize(len(shard_rows), extra={"encoder": info})


def write_anchor_embeddings(
    root: Path, clusters: int, shard_rows: list[int], info: dict | None = None, seed: int = 0
) -> None:
    """16-d embeddings of ``root``'s sentences (around ``clusters`` random centres, in shards of
    ``shard_rows``) and of its candidates (each near its anchor's vector, in the candidates'
    shards), as the embed stage writes them."""
    ids = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])[S.ID].to_pylist()
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, 16))
    v = unit(
        centres[rng.integers(0, clusters, len(ids))] + 0.9 * rng.standard_normal((len(ids), 16))
    )
    write_embeddings(root / "data/embeddings/sentences", ids, v, shard_rows, info)
    cands = open_dataset(root / "data/candidates", S.CANDIDATES)
    table = cands.read_table([S.ID, S.CANDIDATE_ID])
    row_of = {sid: i for i, sid in enumerate(ids)}
    anchor = np.array([row_of[x] for x in table[S.ID].to_pylist()])
    cv = unit(v[anchor] + 0.4 * rng.standard_normal((len(anchor), 16)))
    write_embeddings(
        root / "data/embeddings/candidates",
        table[S.CANDIDATE_ID].to_pylist(),
        cv,
        [s["rows"] for s in cands.manifest["shards"]],
        info,
    )


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def vocabulary() -> list[str]:
    return SPECIAL + PUNCT + sorted({w.lower() for w in WORDS})


def stage_params(model: Path, corpus_name: str, batch_size: int = 16) -> dict:
    """embed, mine and sample sections for a tiny BERT on one thread (the kill tests' project)."""
    return {
        "embed": {
            "model": str(model),
            "pooling": "mean",
            "max_length": 32,
            "batch_size": batch_size,
            "device": "cpu",
            "threads": 1,
        },
        "mine": {"k": 16, "band_low": 0.0, "band_high": 0.9, "threads": 1},
        "sample": {"corpus_name": corpus_name, "corpus_license": "CC0-1.0", "threads": 1},
    }


def write_params(path: Path, sections: dict) -> None:
    (path / "params.yaml").write_text(yaml.safe_dump(sections, sort_keys=False))


def copy_project(src: Path, dest: Path) -> Path:
    for child in src.iterdir():
        if child.is_dir():
            shutil.copytree(child, dest / child.name, dirs_exist_ok=True)
        else:
            shutil.copy(child, dest / child.name)
    return dest


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float32."""
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered_vectors(
    seed: int, clusters: int, dim: int, n: int, centre_scale: float = 2.0
) -> np.ndarray:
    """``n`` unit vectors around ``clusters`` random centres (neighbours that an IVF index can
    find and miss). Two members of a cluster have cosine about s² / (s² + 1) for
    ``centre_scale`` s: 0.8 at the default, 0.5 at 1 (inside the mining band [0.25, 0.75])."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((clusters, dim)) * centre_scale
    return unit_rows(centers[rng.integers(0, clusters, n)] + rng.standard_normal((n, dim)))


def write_sentence_embeddings(folder: Path, vectors: np.ndarray, model: str) -> None:
    """The embeddings dataset ``embed`` would write for ``folder/data/sentences`` (one shard per
    sentence shard, the same ids in the same order, ``model``'s record with mean pooling), from
    vectors given instead of computed (the benchmarks' synthetic mining inputs)."""
    from pairforge.pipeline.plumbing.shards import open_dataset

    sentences = open_dataset(folder / "data/sentences", S.SENTENCES)
    ids = sentences.read_table([S.ID])[S.ID].to_pylist()
    shard_rows = [shard["rows"] for shard in sentences.manifest["shards"]]
    info = {"model": model, "pooling": "mean", "prompt": None, "max_length": 128,
            "dim": vectors.shape[1], "engine": "transformers", "compute_type": "float32"}  # fmt: skip
    write_embeddings(folder / "data/embeddings/sentences", ids, vectors, shard_rows, info)


def resident_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's header (no path: anonymous)
                inside = len(head) >= 6 and head[5] == str(Path(path).resolve())
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total
