"""Reads verified against the manifest: bit flips, flipped bytes and truncation in a shard of every
dataset kind fail with one line naming the dataset, the shard and the stage to rerun, on every
read path (Dataset, the runner, embeddings row groups, the training stream); `pairforge verify`."""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import pyarrow as pa
import pytest
from pairforge.pipeline.plumbing import integrity
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing import shards as shards_module
from pairforge.pipeline.plumbing.errors import CorruptShardError
from pairforge.pipeline.plumbing.runner import LocalExecutor, ShardResult, map_shards
from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset
from pairforge.stages.verify import verify_dataset

from tests.conftest import run_cli

EMB16 = S.embeddings_spec(8, "float16")
EMB32 = S.embeddings_spec(8, "float32")
KINDS = {
    spec.name + ("" if spec.name != "embeddings" else f"-{dtype}"): spec
    for spec, dtype in [
        (S.SENTENCES, None),
        (S.QUARANTINE, None),
        (S.RAW_RECORDS, None),
        (S.CLEAN_RECORDS, None),
        (S.CANDIDATES, None),
        (S.POOLS, None),
        (S.PAIRS, None),
        (EMB16, "float16"),
        (EMB32, "float32"),
    ]
}


def _values(dtype: pa.DataType, n: int, rng: np.random.Generator) -> pa.Array:
    """``n`` valid, varied values of an Arrow type (enough variety for compression to matter)."""
    if pa.types.is_fixed_size_list(dtype):
        vectors = rng.normal(size=(n, dtype.list_size))
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        flat = vectors.astype(dtype.value_type.to_pandas_dtype()).ravel()
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, dtype.value_type), dtype.list_size)
    if pa.types.is_list(dtype):
        inner = _values(dtype.value_type, 3 * n, rng)
        return pa.ListArray.from_arrays(pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)), inner)
    if pa.types.is_string(dtype):
        words = ["players", "drink", "river", "stone", "quiet", "market", "engine", "lantern"]
        return pa.array(
            [" ".join(rng.choice(words, size=6)) + f" {i}" for i in range(n)], type=dtype
        )
    if pa.types.is_binary(dtype):
        return pa.array([f"raw line {i}".encode() for i in range(n)], type=dtype)
    if pa.types.is_boolean(dtype):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_floating(dtype):
        return pa.array(rng.random(n).astype(dtype.to_pandas_dtype()), type=dtype)
    if pa.types.is_integer(dtype):
        return pa.array(np.arange(n), type=dtype)
    raise AssertionError(f"no generator for {dtype}")


def table_of(spec: S.SchemaSpec, n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({f.name: _values(f.type, n, rng) for f in spec.schema}, schema=spec.schema)


def write(folder, spec, shards=2, rows=40, fingerprint="f") -> dict:
    writer = DatasetWriter(folder, spec, stage="sample", params={}, fingerprint=fingerprint)
    for i in range(shards):
        writer.write(i, table_of(spec, rows, seed=i))
    return writer.finalize(shards)


def one_line(exc: pytest.ExceptionInfo, folder, shard: str) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{folder}: shard {shard} ")
    assert "`pairforge sample`" in message and "fetch the dataset again" in message
    return message


@pytest.mark.parametrize("kind", list(KINDS))
def test_bit_flips_and_truncation_in_every_dataset_kind(tmp_path, kind):
    spec = KINDS[kind]
    folder = tmp_path / kind
    manifest = write(folder, spec)
    shard = manifest["shards"][1]["file"]
    file = folder / shard
    pristine = file.read_bytes()
    assert open_dataset(folder, spec).read_table().num_rows == 80
    rng = random.Random(kind)
    # Single-bit flips anywhere in the file (many decode without error if nothing checks them).
    for _ in range(24):
        data = bytearray(pristine)
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        file.write_bytes(bytes(data))
        with pytest.raises(CorruptShardError) as exc:
            open_dataset(folder, spec).read_shard(1)
        assert "xxh3_128 mismatch" in one_line(exc, folder, shard)
    # 16 flipped bytes in the middle.
    data = bytearray(pristine)
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    file.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError) as exc:
        open_dataset(folder, spec).read_table()
    one_line(exc, folder, shard)
    # Truncation: the size alone tells.
    file.write_bytes(pristine[: len(pristine) // 2])
    with pytest.raises(CorruptShardError) as exc:
        open_dataset(folder, spec).read_shard(1)
    message = one_line(exc, folder, shard)
    assert f"size {len(pristine) // 2} != {len(pristine)} in the manifest" in message
    report = verify_dataset(folder)
    assert not report.ok and any("size" in p for p in report.problems)
    file.write_bytes(pristine)
    assert (
        open_dataset(folder, spec)
        .read_table()
        .equals(pa.concat_tables([table_of(spec, 40, 0), table_of(spec, 40, 1)]))
    )
    assert verify_dataset(folder).ok


def _flip(file, offset: int = 100) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x04
    file.write_bytes(bytes(data))


def _upper(table: pa.Table) -> ShardResult:
    return ShardResult({"out": table}, {"rows": table.num_rows})


def test_runner_verifies_its_input_shards(tmp_path):
    write(tmp_path / "in", S.SENTENCES)
    _flip(tmp_path / "in" / "data/part-00000.parquet")
    out = DatasetWriter(tmp_path / "out", S.SENTENCES, stage="t", params={}, fingerprint="g")
    with pytest.raises(CorruptShardError, match=r"shard data/part-00000.parquet is corrupt"):
        map_shards(
            _upper, open_dataset(tmp_path / "in", S.SENTENCES), {"out": out}, LocalExecutor(), "t"
        )
    assert not out.is_done(0)
    out.close()


def test_embeddings_row_groups_are_verified(tmp_path):
    from pairforge.pipeline.science.mining_inputs import iter_vectors, open_embeddings

    write(tmp_path / "emb", EMB16)
    _flip(tmp_path / "emb" / "data/part-00001.parquet")
    dataset = open_embeddings(tmp_path / "emb")
    assert sum(len(ids) for ids, _ in iter_vectors(dataset, 0)) == 40
    with pytest.raises(CorruptShardError, match="part-00001.parquet is corrupt"):
        list(iter_vectors(dataset, 1))


def test_training_stream_is_verified(tmp_path):
    from pairforge.train.data import PairsSource, RowStream

    write(tmp_path / "pairs", S.PAIRS)
    source = PairsSource(tmp_path / "pairs").select([S.TEXT])
    _flip(tmp_path / "pairs" / "data/part-00001.parquet", offset=-200)
    stream = RowStream(source, seed=0, buffer_size=1, read_rows=8)
    with pytest.raises(CorruptShardError, match="training data .*part-00001.parquet is corrupt"):
        for _ in range(40):  # two epochs' worth: shard 1 is reached whatever the shard order
            stream.take(8)


def test_a_shard_is_hashed_once_per_process_until_it_changes(tmp_path, monkeypatch):
    write(tmp_path / "ds", S.SENTENCES)
    old = time.time() - 60  # files changed in the last seconds are always re-hashed (racy)
    for file in (tmp_path / "ds" / "data").iterdir():
        os.utime(file, (old, old))
    calls = []
    real = integrity._hasher
    monkeypatch.setattr(integrity, "_hasher", lambda a: calls.append(a) or real(a))
    dataset = open_dataset(tmp_path / "ds", S.SENTENCES)
    dataset.read_table()
    dataset.read_table()
    dataset.verify()
    assert calls == ["xxh3_128", "xxh3_128"]
    _flip(tmp_path / "ds" / "data/part-00000.parquet")
    with pytest.raises(CorruptShardError):
        dataset.read_shard(0)


def test_old_manifest_without_fast_checksum_verifies_with_sha256(tmp_path):
    write(tmp_path / "ds", S.SENTENCES)
    path = tmp_path / "ds" / "_manifest.json"
    manifest = json.loads(path.read_text())
    for shard in manifest["shards"]:
        del shard["xxh3_128"]
    path.write_text(json.dumps(manifest))
    assert open_dataset(tmp_path / "ds", S.SENTENCES).read_table().num_rows == 80
    _flip(tmp_path / "ds" / "data/part-00000.parquet")
    with pytest.raises(CorruptShardError, match="sha256 mismatch"):
        open_dataset(tmp_path / "ds", S.SENTENCES).read_shard(0)


def test_verify_command(tmp_path):
    write(tmp_path / "good", S.SENTENCES)
    write(tmp_path / "bad", S.POOLS)
    _flip(tmp_path / "bad" / "data/part-00001.parquet")
    (tmp_path / "bad" / "data/part-00007.parquet").write_bytes(b"PAR1 stray")
    result = run_cli(["verify", "good"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("good: ok: 2 shards, 80 rows,")
    assert "(sha256 + xxh3_128)" in result.stdout
    result = run_cli(["verify", "good", "bad", "missing"], cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("good: ok")
    assert "bad: FAILED: 3 problem(s)" in lines
    assert "  shard data/part-00001.parquet: sha256 mismatch; rerun `pairforge sample`" in (
        result.stdout
    )
    assert "data/part-00007.parquet is not in the manifest" in result.stdout
    assert any(line.startswith("missing: FAILED") for line in lines)
    assert "2 of 3 dataset(s) failed verification" in result.stderr


def test_a_stage_reading_a_corrupt_shard_exits_2_with_one_line(tmp_path):
    """The CLI's one line for a corrupt input: `pairforge report` reads data/pairs."""
    import yaml

    write(tmp_path / "data/pairs", S.PAIRS)
    write(tmp_path / "data/sentences", S.SENTENCES)
    _flip(tmp_path / "data/pairs/data/part-00000.parquet")
    params = yaml.safe_load((shards_module.Path(__file__).parents[2] / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = run_cli(["report"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: data/pairs: shard data/part-00000.parquet is corrupt (xxh3_128 mismatch; size "
        f"{(tmp_path / 'data/pairs/data/part-00000.parquet').stat().st_size} as in the manifest); "
        "rerun the stage that writes it (`pairforge sample`) or fetch the dataset again"
    ]
    assert "Traceback" not in result.stderr


def test_no_reader_bypasses_the_verified_read():
    """Every Parquet read of a pairforge dataset goes through the verified functions
    (pipeline/plumbing/integrity.py; files.py's open_parquet, the one opener, opens what they
    checked); raw corpus files (pipeline/science/readers.py, ingest's inputs) are not datasets."""
    import ast

    from tests.conftest import ROOT

    readers = {
        "read_table",
        "read_pandas",
        "ParquetFile",
        "ParquetDataset",
        "read_schema",
        "read_metadata",
        "read_parquet",
        "scan_parquet",
        "dataset",
    }
    modules = {"pq", "pl", "ds", "pa", "polars", "pyarrow", "duckdb"}
    allowed = {
        "pipeline/plumbing/files.py",
        "pipeline/science/readers.py",
        "stages/verify.py",
    }
    offenders = []
    for folder in ("pipeline", "stages", "train"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            rel = str(file.relative_to(ROOT))
            if rel in allowed:
                continue
            for node in ast.walk(ast.parse(file.read_text())):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                func = node.func
                direct = func.attr in readers and getattr(func.value, "id", None) in modules
                if (direct or func.attr == "iter_batches") and not any(
                    word in ast.unparse(node) for word in ("verified", "shard_path(")
                ):
                    offenders.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
    assert not offenders, "unverified dataset reads:\n" + "\n".join(offenders)


def test_format_1_layout_is_still_read_and_rewritten_in_the_new_one(tmp_path):
    """A dataset written before data/ (shards beside the manifest, sha256 only) reads as before;
    a stage writing over it with another fingerprint leaves only the new layout."""
    folder = tmp_path / "ds"
    write(folder, S.SENTENCES)
    path = folder / "_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 1
    manifest["created_at"] = "2026-01-01T00:00:00Z"
    for shard in manifest["shards"]:
        del shard["xxh3_128"]
        (folder / shard["file"]).rename(folder / shard["file"].removeprefix("data/"))
        shard["file"] = shard["file"].removeprefix("data/")
    (folder / "data").rmdir()
    path.write_text(json.dumps(manifest))
    old = open_dataset(folder, S.SENTENCES)
    assert old.read_table().num_rows == 80 and verify_dataset(folder).ok
    _flip(folder / "part-00001.parquet")
    with pytest.raises(CorruptShardError, match="shard part-00001.parquet is corrupt .sha256"):
        old.read_shard(1)
    manifest = write(folder, S.SENTENCES, shards=1, fingerprint="new code")
    assert sorted(p.name for p in folder.iterdir()) == ["_manifest.json", "data"]
    assert manifest["format_version"] == 2 and verify_dataset(folder).ok


@pytest.mark.parametrize(
    ("file", "why"),
    [
        ("../victim/secret.parquet", "a path that leaves the dataset"),
        ("data/../../victim/secret.parquet", "a path that leaves the dataset"),
        ("/tmp/victim/secret.parquet", "an absolute path"),
        ("C:/victim/secret.parquet", "an absolute path"),
        ("data\\..\\..\\secret.parquet", "a path with a backslash"),
        ("other/part-00000.parquet", "not a Parquet file directly in its data/ folder"),
        ("data/sub/part-00000.parquet", "not a Parquet file directly in its data/ folder"),
        (7, "which is not a path"),
    ],
)
def test_a_manifest_naming_a_file_outside_its_data_folder_is_refused(tmp_path, file, why):
    """A copy of a dataset whose manifest names a file beside it (with that shard's very bytes,
    so every checksum agrees) passes neither `pairforge verify` nor any read."""
    folder = tmp_path / "sentences"
    write(folder, S.SENTENCES)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret.parquet").write_bytes((folder / "data/part-00000.parquet").read_bytes())
    manifest = json.loads((folder / "_manifest.json").read_text())
    manifest["shards"][0]["file"] = file
    (folder / "_manifest.json").write_text(json.dumps(manifest))
    expected = (
        f"dataset {str(folder)!r}: refused: its manifest names shard {file!r}, {why} (a "
        "dataset's manifest may name only files in its own data/ folder)"
    )
    with pytest.raises(shards_module.DataIntegrityError) as exc:
        open_dataset(folder, S.SENTENCES)
    assert str(exc.value) == expected
    report = verify_dataset(folder)
    assert not report.ok and report.problems == [expected]


def test_the_verify_command_refuses_a_manifest_pointing_outside(tmp_path):
    write(tmp_path / "sentences", S.SENTENCES)
    manifest = json.loads((tmp_path / "sentences/_manifest.json").read_text())
    manifest["shards"][1]["file"] = "../victim/secret.parquet"
    (tmp_path / "sentences/_manifest.json").write_text(json.dumps(manifest))
    result = run_cli(["verify", "sentences"], cwd=tmp_path)
    assert result.returncode == 1
    assert "sentences: FAILED: 1 problem(s)" in result.stdout
    assert "refused: its manifest names shard '../victim/secret.parquet'" in result.stdout
