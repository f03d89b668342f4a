"""embed with ``--engine onnxruntime`` end to end, as a user runs it: the datasets' manifests
and the metrics name the engine and compute type, the vectors are the in-process engine's, and
a rerun reuses the export and the finished datasets; several GPUs leave it on the CPU, in
this process."""

from __future__ import annotations

import numpy as np
import onnxruntime  # noqa: F401 (required: a broken install must fail, not skip)
import pyarrow as pa
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
from pairforge.pipeline.science.models import load_text_encoder
from pairforge.stages.embed.stage import embed_shard

from tests.conftest import run_cli
from tests.stages.mining_helpers import copy_project, read_json, stage_params, write_params


@pytest.mark.slow
def test_embed_command_with_the_onnxruntime_engine(tiny_bert, mining_inputs, tmp_path):
    root = copy_project(mining_inputs, tmp_path / "project")
    write_params(root, {"embed": stage_params(tiny_bert, "test")["embed"]})
    args = ["embed", "--engine", "onnxruntime", "--models-dir", "onnx", "--no-progress"]
    done = run_cli(args, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "exporting" in done.stderr and "quantising" in done.stderr
    for name in ("sentences", "candidates"):
        encoder = open_embeddings(root / f"data/embeddings/{name}").manifest["encoder"]
        assert (encoder["engine"], encoder["compute_type"]) == ("onnxruntime", "int8")
    metrics = read_json(root / "metrics/embed.json")
    assert metrics["encoder"]["engine"] == "onnxruntime"
    assert metrics["candidates"]["rows"] > 0 and metrics["sentences"]["computed_shards"] == 6

    # The command's vectors are the engine's, shard by shard: int8 activations are quantised
    # with one scale per batch, so a text's vector depends on the batch it is encoded in.
    sentences = open_dataset(root / "data/sentences", S.SENTENCES)
    encoder = load_text_encoder(
        str(tiny_bert),
        "mean",
        device="cpu",
        max_length=32,
        batch_size=16,
        threads=1,
        engine="onnxruntime",
        models_dir=str(root / "onnx"),
    )
    expected = pa.concat_tables(embed_shard(t, encoder) for t in sentences.iter_shards())
    ids = sentences.read_table([S.ID])[S.ID]
    got = load_vectors(open_embeddings(root / "data/embeddings/sentences"), ids)
    want = np.array(expected[S.VECTOR].to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=1e-6)

    # A rerun: nothing exported or embedded again.
    again = run_cli(args, cwd=root)
    assert again.returncode == 0, again.stderr
    assert "exporting" not in again.stderr and "quantising" not in again.stderr
    assert read_json(root / "metrics/embed.json")["sentences"]["computed_shards"] == 0

    # int8 vectors depend on their batch: another batch size embeds again, not reusing them.
    rebatched = run_cli([*args, "--batch-size", "8"], cwd=root)
    assert rebatched.returncode == 0, rebatched.stderr
    assert read_json(root / "metrics/embed.json")["sentences"]["computed_shards"] == 6
    by8 = load_vectors(open_embeddings(root / "data/embeddings/sentences"), ids)
    assert np.abs(by8 - got).max() > 1e-4  # so reusing the batch-16 vectors would mix two
    # So does another token budget (it may split the batches).
    budget = run_cli([*args, "--batch-size", "8", "--max-batch-tokens", "100"], cwd=root)
    assert budget.returncode == 0, budget.stderr
    assert read_json(root / "metrics/embed.json")["sentences"]["computed_shards"] == 6

    # The engine is part of the fingerprint: float32 embeds again and says so.
    f32 = run_cli([*args, "--compute-type", "float32"], cwd=root)
    assert f32.returncode == 0, f32.stderr
    assert read_json(root / "metrics/embed.json")["sentences"]["computed_shards"] == 6
    manifest = open_embeddings(root / "data/embeddings/sentences").manifest["encoder"]
    assert manifest["compute_type"] == "float32"
    # float32 depends on its batch by float rounding only: another batch size reuses it.
    f32b = run_cli([*args, "--compute-type", "float32", "--batch-size", "8"], cwd=root)
    assert f32b.returncode == 0, f32b.stderr
    assert read_json(root / "metrics/embed.json")["sentences"]["computed_shards"] == 0

    bad = run_cli([*args, "--compute-type", "int8_float16"], cwd=root)
    assert bad.returncode == 2
    assert "'int8_float16' is not available for the onnxruntime engine" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_several_gpus_do_not_take_the_onnxruntime_engine_off_the_cpu(
    tiny_bert, mining_inputs, tmp_path, monkeypatch
):
    """On a machine with several GPUs, ``device: auto`` gives the other engines a Dask worker
    per GPU; the onnxruntime engine (CPU only) stays in this process on the CPU."""
    import torch
    from pairforge.pipeline.plumbing import runner
    from pairforge.stages.cli import app
    from typer.testing import CliRunner

    root = copy_project(mining_inputs, tmp_path / "project")
    embed = {**stage_params(tiny_bert, "test")["embed"], "device": "auto"}
    write_params(root, {"embed": embed})
    monkeypatch.chdir(root)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def no_dask(*args, **kwargs):
        raise AssertionError("a Dask worker per GPU was started")

    monkeypatch.setattr(runner, "DaskExecutor", no_dask)
    args = ["embed", "--engine", "onnxruntime", "--models-dir", "onnx", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    metrics = read_json(root / "metrics/embed.json")
    assert metrics["device"] == "cpu" and metrics["encoder"]["engine"] == "onnxruntime"


def test_the_planning_process_picks_the_int8_weights_for_every_worker(
    tiny_bert, mining_inputs, tmp_path, monkeypatch
):
    """onnxruntime's int8 weights depend on the CPU (``ort.int8_weights_for_cpu``): the process
    that plans the run picks them once, the manifest names the recipe, a worker process
    (``EmbedShard`` as Dask pickles it) uses the driver's pick whatever its own CPU, and a rerun
    where the pick differs embeds again instead of mixing two quantisations."""
    import pickle

    from pairforge.pipeline.science.models import ort
    from pairforge.stages.cli import app
    from pairforge.stages.embed.stage import EmbedConfig, EmbedShard
    from typer.testing import CliRunner

    root = copy_project(mining_inputs, tmp_path / "project")
    write_params(root, {"embed": stage_params(tiny_bert, "test")["embed"]})
    monkeypatch.chdir(root)
    args = ["embed", "--engine", "onnxruntime", "--models-dir", "onnx", "--no-progress"]
    vectors = {}
    for weights in ("uint8", "int8", "int8"):
        monkeypatch.setattr(ort, "default_recipe", lambda w=weights: ort.Int8Recipe(weights=w))
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        metrics = read_json(root / "metrics/embed.json")
        redone = weights not in vectors
        assert metrics["sentences"]["computed_shards"] == (6 if redone else 0)
        embeddings = open_embeddings(root / "data/embeddings/sentences")
        assert embeddings.manifest["encoder"]["int8_recipe"] == f"ffn_output-{weights}-smooth0.8"
        ids = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])[S.ID]
        vectors[weights] = load_vectors(embeddings, ids)
    assert np.abs(vectors["uint8"] - vectors["int8"]).max() > 1e-4

    # A worker: the driver's pick travels with the pickled task, not the worker's CPU's.
    cfg = EmbedConfig(**{**stage_params(tiny_bert, "test")["embed"], "engine": "onnxruntime"})
    monkeypatch.setattr(ort, "default_recipe", lambda: ort.Int8Recipe(weights="uint8"))
    shard = pickle.loads(pickle.dumps(EmbedShard(cfg, "run", S.ID, False, None, "int8")))
    assert shard.int8_weights == "int8" and shard._state()["lazy"].int8_weights == "int8"
