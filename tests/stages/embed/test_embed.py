"""embed: a tiny BERT built in the test; poolings, length-sorted batches, storage, candidates
and LLM rewrites."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import IncompleteDatasetError, PairforgeError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
from pairforge.pipeline.science.models import load_text_encoder
from pairforge.pipeline.science.text import sentence_id
from pairforge.stages.embed.stage import EmbedConfig, embed_shard, run

from tests.stages.mining_helpers import (
    candidate_rows,
    copy_project,
    make_texts,
    read_json,
    write_candidates,
    write_sentences,
)


def _direct(folder, texts, pooling):
    """Vectors computed the plain way: one text at a time, no sorting, no padding."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    out = []
    with torch.inference_mode():
        for t in texts:
            enc = tok(t, return_tensors="pt")
            o = model(**enc)
            if pooling == "cls_before_pooler":
                v = o.last_hidden_state[0, 0]
            elif pooling == "cls":
                v = o.pooler_output[0]
            else:
                v = o.last_hidden_state[0].mean(0)
            out.append((v / v.norm()).numpy())
    return np.stack(out)


@pytest.mark.parametrize("pooling", ["cls", "cls_before_pooler", "mean"])
def test_batched_length_sorted_equals_one_by_one(tiny_bert, pooling):
    texts = make_texts(37, seed=3)
    enc = load_text_encoder(str(tiny_bert), pooling, device="cpu", batch_size=8)
    got = enc.encode(texts)
    assert got.shape == (37, 32) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, _direct(tiny_bert, texts, pooling), atol=2e-5)


def test_poolings_differ_and_mask_survives_truncation(tiny_bert):
    texts = make_texts(4, seed=4)
    vecs = {
        p: load_text_encoder(str(tiny_bert), p, device="cpu").encode(texts)
        for p in ("cls", "mean", "mask")
    }
    assert not np.allclose(vecs["cls"], vecs["mean"])
    assert not np.allclose(vecs["mask"], vecs["mean"])
    long = [" ".join(["river"] * 200)]
    enc = load_text_encoder(str(tiny_bert), "mask", device="cpu", max_length=16)
    assert np.isfinite(enc.encode(long)).all()  # the [MASK] was not cut away
    # The sentence was cut, the prompt kept: as if the sentence had been short to begin with.
    overhead = len(enc.tokenizer('"" means [MASK].')["input_ids"])  # prompt + [CLS]/[SEP]
    cut = " ".join(["river"] * (16 - overhead))
    np.testing.assert_allclose(enc.encode(long), enc.encode([cut]), atol=1e-5)


def test_nan_model_output_is_a_clear_error(tiny_bert):
    enc = load_text_encoder(str(tiny_bert), "mean", device="cpu")
    with torch.no_grad():
        enc.model.embeddings.word_embeddings.weight[10:].fill_(float("nan"))
    with pytest.raises(PairforgeError, match="NaN/inf or zero vector"):
        enc.encode(["the river is quiet ."])


def test_embed_shard_dedupes_and_stores_float16(tiny_bert):
    enc = load_text_encoder(str(tiny_bert), "mean", device="cpu")
    calls = []
    real = enc.encode
    enc.encode = lambda texts, progress=None: calls.append(len(texts)) or real(texts, progress)
    table = pa.table(
        {S.ID: ["a", "b", "c"], S.TEXT: ["the river .", "an old bank .", "the river ."]}
    )
    out = embed_shard(table, enc, vector_dtype="float16")
    assert calls == [2]
    assert out.schema.field(S.VECTOR).type == pa.list_(pa.float16(), 32)
    v = np.asarray(out[S.VECTOR].combine_chunks().flatten().to_numpy(), dtype=np.float32).reshape(
        3, 32
    )
    np.testing.assert_array_equal(v[0], v[2])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=2e-3)


def _cfg(root, model, **kw) -> EmbedConfig:
    base = dict(
        model=str(model),
        pooling="mean",
        max_length=32,
        batch_size=16,
        device="cpu",
        sentences=str(root / "data/sentences"),
        candidates=str(root / "data/candidates"),
        output=str(root / "data/embeddings/sentences"),
        candidates_output=str(root / "data/embeddings/candidates"),
        rewrites=str(root / "data/rewrites"),
        rewrites_output=str(root / "data/embeddings/rewrites"),
        metrics=str(root / "metrics/embed.json"),
    )
    return EmbedConfig(**{**base, **kw})


def test_embed_stage_aligns_vectors_with_ids(tiny_bert, mining_inputs, tmp_path):
    root = copy_project(mining_inputs, tmp_path)
    metrics = run(_cfg(root, tiny_bert, vector_dtype="float16"), progress=False)
    assert metrics["sentences"]["rows"] == 240 and metrics["candidates"]["rows"] == 960
    assert metrics["candidates"]["status"] == "embedded" and metrics["dim"] == 32
    sentences = open_dataset(root / "data/sentences", S.SENTENCES)
    emb = open_embeddings(root / "data/embeddings/sentences")
    assert len(emb) == len(sentences) == 6
    assert emb.manifest["encoder"]["pooling"] == "mean"
    ids = sentences.read_table([S.ID])[S.ID].combine_chunks()
    vectors = load_vectors(emb, ids)  # raises if ids or order differ
    texts = sentences.read_table([S.TEXT])[S.TEXT].to_pylist()
    direct = load_text_encoder(str(tiny_bert), "mean", device="cpu", max_length=32).encode(
        texts[:5]
    )
    np.testing.assert_allclose(vectors[:5], direct, atol=2e-3)  # float16 storage
    cands = open_dataset(root / "data/candidates", S.CANDIDATES)
    cemb = open_embeddings(root / "data/embeddings/candidates")
    ctable = cands.read_table([S.ID, S.CANDIDATE_ID, S.TEXT])
    assert cemb.read_table([S.ID])[S.ID].equals(ctable[S.CANDIDATE_ID])
    # Candidates identical to their sentence reuse its vector instead of being encoded again.
    cvec = load_vectors(cemb, ctable[S.CANDIDATE_ID].combine_chunks())
    row_of = {x: i for i, x in enumerate(ids.to_pylist())}
    same = [
        (k, row_of[sid])
        for k, (sid, t) in enumerate(
            zip(ctable[S.ID].to_pylist(), ctable[S.TEXT].to_pylist(), strict=True)
        )
        if t == texts[row_of[sid]]
    ]
    assert same and metrics["candidates"]["reused_sentence_vectors"] == len(same)
    for k, r in same:
        np.testing.assert_array_equal(cvec[k], vectors[r])
    other = next(k for k in range(len(ctable)) if k not in dict(same))
    direct_c = load_text_encoder(str(tiny_bert), "mean", device="cpu", max_length=32).encode(
        [ctable[S.TEXT][other].as_py()]
    )
    np.testing.assert_allclose(cvec[other], direct_c[0], atol=2e-3)
    # A second run with the same inputs computes nothing.
    again = run(_cfg(root, tiny_bert, vector_dtype="float16"), progress=False)
    assert again["sentences"]["computed_rows"] == 0 and again["candidates"]["computed_rows"] == 0


def test_a_candidate_with_another_sentences_text_reuses_that_vector(tiny_bert, tmp_path):
    """Each text is encoded once across sentences and candidates: a candidate equal to its own
    sentence, or to another sentence of the corpus, takes that sentence's stored vector."""
    texts = make_texts(12, seed=5)
    ids = [sentence_id(t) for t in texts]
    write_sentences(tmp_path / "data/sentences", texts, rows_per_shard=6)
    rows = candidate_rows(ids, texts, seed=1)[:16]
    for r in rows:  # none equal to a sentence, unless set so below
        r[S.TEXT] = f"{r[S.TEXT]} but"
    rows[0][S.TEXT] = texts[0]  # its own sentence's text
    rows[5][S.TEXT] = texts[9]  # another sentence's text (in the other shard)
    rows[6][S.TEXT] = texts[9]
    fresh = [r[S.TEXT] for i, r in enumerate(rows) if i not in (0, 5, 6)]
    assert not set(fresh) & set(texts)
    write_candidates(tmp_path / "data/candidates", rows, rows_per_shard=8)
    metrics = run(_cfg(tmp_path, tiny_bert), progress=False)
    assert metrics["candidates"]["reused_sentence_vectors"] == 3
    svec = load_vectors(open_embeddings(tmp_path / "data/embeddings/sentences"), pa.array(ids))
    cvec = load_vectors(
        open_embeddings(tmp_path / "data/embeddings/candidates"),
        pa.array([r[S.CANDIDATE_ID] for r in rows]),
    )
    np.testing.assert_array_equal(cvec[0], svec[0])
    np.testing.assert_array_equal(cvec[5], svec[9])
    np.testing.assert_array_equal(cvec[6], svec[9])
    # The others were encoded: a text's vector, not a sentence's.
    direct = load_text_encoder(str(tiny_bert), "mean", device="cpu", max_length=32)
    np.testing.assert_allclose(cvec[1], direct.encode([rows[1][S.TEXT]])[0], atol=1e-5)


def test_absent_candidates_give_an_empty_dataset_and_say_so(tiny_bert, tmp_path, caplog):
    write_sentences(tmp_path / "data/sentences", make_texts(30), rows_per_shard=30)
    metrics = run(_cfg(tmp_path, tiny_bert), progress=False)
    assert metrics["candidates"]["status"] == "absent"
    assert "no candidates dataset" in caplog.text
    empty = open_embeddings(tmp_path / "data/embeddings/candidates")
    assert empty.num_rows == 0 and len(empty) == 0
    assert read_json(tmp_path / "metrics/embed.json")["candidates"]["status"] == "absent"
    off = run(_cfg(tmp_path, tiny_bert, candidates=None), progress=False)
    assert off["candidates"]["status"] == "disabled"


def test_interrupted_candidates_are_an_error(tiny_bert, tmp_path):
    write_sentences(tmp_path / "data/sentences", make_texts(30), rows_per_shard=30)
    (tmp_path / "data/candidates/_progress").mkdir(parents=True)
    with pytest.raises(IncompleteDatasetError, match="interrupted"):
        run(_cfg(tmp_path, tiny_bert), progress=False)


def test_rewrites_are_embedded_like_candidates(tiny_bert, tmp_path):
    texts = make_texts(30)
    write_sentences(tmp_path / "data/sentences", texts, rows_per_shard=15)
    ids = [sentence_id(t) for t in texts]
    rows = [
        {**r, S.ROUTE: "llm", S.ENGINE: "openai", S.CANDIDATE_ID: f"llm-{k}"}
        for k, r in enumerate(candidate_rows(ids, texts)[:40:4])
    ]
    write_candidates(tmp_path / "data/rewrites", rows, rows_per_shard=5)
    metrics = run(_cfg(tmp_path, tiny_bert, candidates=None), progress=False)
    assert metrics["candidates"]["status"] == "disabled"
    assert metrics["rewrites"]["status"] == "embedded" and metrics["rewrites"]["rows"] == 10
    emb = open_embeddings(tmp_path / "data/embeddings/rewrites")
    assert len(emb) == 2 and emb.manifest["encoder"]["pooling"] == "mean"
    vectors = load_vectors(emb, pa.array([r[S.CANDIDATE_ID] for r in rows]))
    other = next(k for k, r in enumerate(rows) if not r[S.IDENTICAL])
    direct = load_text_encoder(str(tiny_bert), "mean", device="cpu", max_length=32).encode(
        [rows[other][S.TEXT]]
    )
    np.testing.assert_allclose(vectors[other], direct[0], atol=1e-5)
    off = run(_cfg(tmp_path, tiny_bert, rewrites=None), progress=False)
    assert off["rewrites"]["status"] == "disabled"
    assert open_embeddings(tmp_path / "data/embeddings/rewrites").num_rows == 0
