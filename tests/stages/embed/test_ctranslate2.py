"""embed's ctranslate2 engine on a tiny BERT built in the test: float32 equals the transformers
engine, int8 stays close, every pooling, the conversion made once, the stage's manifest and
resume."""

from __future__ import annotations

import logging

import ctranslate2  # noqa: F401 (required: a broken install must fail, not skip)
import numpy as np
import pytest
from pairforge.pipeline.plumbing import runner
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
from pairforge.pipeline.science.models import SentenceEncoder, load_text_encoder
from pairforge.stages.embed.stage import EmbedConfig, run

from tests.stages.mining_helpers import copy_project, make_texts, read_json

POOLINGS = ["mean", "cls", "cls_before_pooler", "mask"]


def _encoder(model, pooling, tmp_path, **kw) -> SentenceEncoder:
    return load_text_encoder(
        str(model),
        pooling,
        device="cpu",
        batch_size=8,
        max_length=32,
        threads=1,
        models_dir=str(tmp_path / "ct2"),
        **kw,
    )


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return make_texts(40, seed=5)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_float32_engine_equals_transformers_and_int8_stays_close(
    tiny_bert, texts, tmp_path, pooling
):
    torch_vectors = _encoder(tiny_bert, pooling, tmp_path).encode(texts)
    fp32 = _encoder(tiny_bert, pooling, tmp_path, engine="ctranslate2", compute_type="float32")
    int8 = _encoder(tiny_bert, pooling, tmp_path, engine="ctranslate2", compute_type="int8")
    got32, got8 = fp32.encode(texts), int8.encode(texts)
    assert got8.shape == (40, 32) and got8.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got8, axis=1), 1.0, atol=1e-5)
    # The same weights in float32: the same vectors (padding, token types and pooling agree).
    np.testing.assert_allclose(got32, torch_vectors, atol=1e-4)
    # int8 weights and activations on a random 32-d model: close, not equal. Its texts' vectors
    # lie closer together than that error (cosine ~0.995 apart), so nothing finer holds here;
    # MiniLM on the STS sentences is measured in docs/mine.md.
    cos = np.einsum("ij,ij->i", got8, torch_vectors)
    assert cos.min() > 0.95 and cos.mean() > 0.98, (cos.min(), cos.mean())
    assert not np.allclose(got8, torch_vectors, atol=1e-4)  # it did run quantised
    info = int8.info()
    assert (info["engine"], info["compute_type"], info["dtype"]) == (
        "ctranslate2",
        "int8",
        "float32",
    )
    assert _encoder(tiny_bert, pooling, tmp_path).info()["engine"] == "transformers"


def test_conversion_is_made_once_per_compute_type(tiny_bert, texts, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="pairforge"):
        first = _encoder(tiny_bert, "mean", tmp_path, engine="ctranslate2").encode(texts)
        again = _encoder(tiny_bert, "mean", tmp_path, engine="ctranslate2").encode(texts)
    assert caplog.text.count("converting") == 1
    np.testing.assert_array_equal(first, again)
    folders = sorted(p.name for p in (tmp_path / "ct2").iterdir() if not p.name.startswith("."))
    assert len(folders) == 1 and folders[0].endswith("-int8")
    _encoder(tiny_bert, "mean", tmp_path, engine="ctranslate2", compute_type="float32")
    assert len([p for p in (tmp_path / "ct2").iterdir() if not p.name.startswith(".")]) == 2


def test_bad_settings_are_clear_errors(tiny_bert, tmp_path):
    with pytest.raises(ConfigError, match="dtype 'bfloat16' applies to the transformers engine"):
        _encoder(tiny_bert, "mean", tmp_path, engine="ctranslate2", dtype="bfloat16")
    with pytest.raises(ConfigError, match="engine 'onnx': allowed transformers, ctranslate2"):
        _encoder(tiny_bert, "mean", tmp_path, engine="onnx")
    enc = _encoder(tiny_bert, "mean", tmp_path, engine="ctranslate2")
    with pytest.raises(PairforgeError, match="no training mode"):
        enc.encode(["a sentence"], dropout=True)
    with pytest.raises(ConfigError, match="no such folder"):
        _encoder(tmp_path / "missing", "mean", tmp_path, engine="ctranslate2")


def _cfg(root, model, **kw) -> EmbedConfig:
    base = dict(
        model=str(model),
        pooling="mean",
        max_length=32,
        batch_size=16,
        device="cpu",
        threads=1,
        engine="ctranslate2",
        models_dir=str(root / ".cache/ct2"),
        sentences=str(root / "data/sentences"),
        candidates=str(root / "data/candidates"),
        output=str(root / "data/embeddings/sentences"),
        candidates_output=str(root / "data/embeddings/candidates"),
        rewrites=str(root / "data/rewrites"),
        rewrites_output=str(root / "data/embeddings/rewrites"),
        metrics=str(root / "metrics/embed.json"),
    )
    return EmbedConfig(**{**base, **kw})


class _Killed(Exception):
    pass


def test_stage_records_the_engine_and_resumes(tiny_bert, mining_inputs, tmp_path, monkeypatch):
    whole = copy_project(mining_inputs, tmp_path / "whole")
    metrics = run(_cfg(whole, tiny_bert), progress=False)
    assert metrics["encoder"]["engine"] == "ctranslate2"
    assert metrics["encoder"]["compute_type"] == "int8"
    assert read_json(whole / "metrics/embed.json")["encoder"]["engine"] == "ctranslate2"
    sentences = open_dataset(whole / "data/sentences", S.SENTENCES)
    ids = sentences.read_table([S.ID])[S.ID].combine_chunks()
    for name in ("sentences", "candidates"):
        emb = open_embeddings(whole / f"data/embeddings/{name}")
        assert emb.manifest["encoder"]["engine"] == "ctranslate2"
        assert emb.manifest["encoder"]["compute_type"] == "int8"
    reference = load_vectors(open_embeddings(whole / "data/embeddings/sentences"), ids)

    # Killed after two sentence shards; the rerun computes only the other four.
    root = copy_project(mining_inputs, tmp_path / "killed")
    write = runner.write_shard  # embed's shards are written by the shard runner
    written = []

    def dying(folder, index, *args, **kwargs):
        if len(written) == 2:
            raise _Killed
        written.append(index)
        return write(folder, index, *args, **kwargs)

    monkeypatch.setattr(runner, "write_shard", dying)
    with pytest.raises(_Killed):
        run(_cfg(root, tiny_bert), progress=False)
    monkeypatch.setattr(runner, "write_shard", write)
    resumed = run(_cfg(root, tiny_bert), progress=False)
    assert resumed["sentences"]["computed_shards"] == 4
    got = load_vectors(open_embeddings(root / "data/embeddings/sentences"), ids)
    np.testing.assert_array_equal(got, reference)
    # The engine is part of the fingerprint: the transformers engine embeds again.
    again = run(_cfg(root, tiny_bert, engine="transformers"), progress=False)
    assert again["sentences"]["computed_shards"] == 6
    assert open_embeddings(root / "data/embeddings/sentences").manifest["encoder"]["engine"] == (
        "transformers"
    )
