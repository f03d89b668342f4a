"""Schemas and the shard format: round trips, mismatch errors, atomicity and resumption."""

from __future__ import annotations

import json

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pairforge.pipeline import schemas as S
from pairforge.pipeline.errors import DataIntegrityError, IncompleteDatasetError
from pairforge.pipeline.shards import DatasetWriter, open_dataset, shard_schema_name


def sentences(n: int, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            S.ID: [f"{i:016x}" for i in range(offset, offset + n)],
            S.TEXT: [f"sentence number {i}" for i in range(offset, offset + n)],
            S.SOURCE: ["a.txt"] * n,
            S.LINE: list(range(offset + 1, offset + n + 1)),
        }
    )


def write_dataset(path, tables, fingerprint="fp1") -> dict:
    writer = DatasetWriter(
        path, S.SENTENCES, stage="test", params={"k": 1}, fingerprint=fingerprint, rows_per_shard=3
    )
    for i, t in enumerate(tables):
        writer.write(i, t, counts={"rows": t.num_rows})
    return writer.finalize(len(tables))


def test_round_trip_and_manifest(tmp_path):
    manifest = write_dataset(tmp_path / "ds", [sentences(3), sentences(2, 3)])
    ds = open_dataset(tmp_path / "ds", S.SENTENCES, verify=True)
    assert ds.num_rows == 5 and len(ds) == 2
    assert ds.read_table().equals(
        pa.concat_tables([sentences(3), sentences(2, 3)]).cast(S.SENTENCES.schema)
    )
    on_disk = json.loads((tmp_path / "ds" / "_manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["schema"] == {**manifest["schema"], "name": "sentences", "version": 1}
    assert [s["rows"] for s in manifest["shards"]] == [3, 2]
    assert all(len(s["sha256"]) == 64 for s in manifest["shards"])
    assert manifest["stage"] == "test" and manifest["params"] == {"k": 1}
    assert "+src." in manifest["code_version"] and manifest["created_at"].endswith("Z")
    assert not (tmp_path / "ds" / "_progress").exists()
    assert shard_schema_name(ds.files[0]) == "sentences"


def test_other_tools_read_the_shards(tmp_path):
    write_dataset(tmp_path / "ds", [sentences(3), sentences(2, 3)])
    glob = str(tmp_path / "ds" / "*.parquet")
    assert pl.read_parquet(glob).height == 5
    assert pq.ParquetDataset(str(tmp_path / "ds")).read().num_rows == 5
    assert duckdb.sql(f"select count(distinct id) from read_parquet('{glob}')").fetchall() == [(5,)]
    assert pq.read_table(tmp_path / "ds").num_rows == 5  # the folder itself, manifest ignored


def test_schema_mismatch_on_write_names_dataset_and_columns(tmp_path):
    writer = DatasetWriter(tmp_path / "ds", S.SENTENCES, stage="t", params={}, fingerprint="f")
    bad = sentences(2).drop_columns([S.LINE]).append_column("lineno", pa.array([1, 2]))
    with pytest.raises(
        S.SchemaError,
        match=r"dataset .*ds.*expected schema sentences v1.*missing \['line'\].*unexpected \['lineno'\]",
    ):
        writer.write(0, bad)
    retyped = sentences(2).set_column(3, S.LINE, pa.array(["1", "2"]))
    with pytest.raises(S.SchemaError, match=r"type of line is string not int64"):
        writer.write(0, retyped)


def test_schema_mismatch_on_read(tmp_path):
    write_dataset(tmp_path / "ds", [sentences(3)])
    with pytest.raises(
        S.SchemaError, match=r"dataset '.*ds': expected schema quarantine v1 .* found sentences v1"
    ):
        open_dataset(tmp_path / "ds", S.QUARANTINE)
    # A shard replaced by one of another layout is caught when it is read.
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "ds" / "part-00000.parquet")
    ds = open_dataset(tmp_path / "ds", S.SENTENCES)
    with pytest.raises(S.SchemaError, match="part-00000.parquet.*missing"):
        ds.read_shard(0)
    with pytest.raises(DataIntegrityError, match="does not match its manifest"):
        ds.verify()


def test_version_mismatch(tmp_path):
    write_dataset(tmp_path / "ds", [sentences(3)])
    path = tmp_path / "ds" / "_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema"]["version"] = 2
    path.write_text(json.dumps(manifest))
    with pytest.raises(S.SchemaError, match="expected schema sentences v1.*found sentences v2"):
        open_dataset(tmp_path / "ds", S.SENTENCES)


def test_dataset_without_manifest_is_never_complete(tmp_path):
    writer = DatasetWriter(tmp_path / "ds", S.SENTENCES, stage="t", params={}, fingerprint="f")
    writer.write(0, sentences(3))
    with pytest.raises(IncompleteDatasetError, match="interrupted"):
        open_dataset(tmp_path / "ds", S.SENTENCES)
    with pytest.raises(IncompleteDatasetError, match="does not exist"):
        open_dataset(tmp_path / "nothing", S.SENTENCES)
    with pytest.raises(DataIntegrityError, match="shard 1 is not finished"):
        writer.finalize(2)


def test_resume_keeps_finished_shards_and_clears_on_new_fingerprint(tmp_path):
    path = tmp_path / "ds"
    first = DatasetWriter(path, S.SENTENCES, stage="t", params={}, fingerprint="f")
    info = first.write(0, sentences(3))
    (path / ".part-00001.parquet.tmp-999").write_bytes(b"half a file")  # a killed writer's leftover
    again = DatasetWriter(path, S.SENTENCES, stage="t", params={}, fingerprint="f")
    assert again.is_done(0) and not again.is_done(1)
    assert again.done_info(0) == info
    assert again.created_at == first.created_at
    assert not list(path.glob(".*.tmp-*"))
    other = DatasetWriter(path, S.SENTENCES, stage="t", params={}, fingerprint="g")
    assert not other.is_done(0)
    assert not (path / "part-00000.parquet").exists()


def test_complete_dataset_with_same_fingerprint_is_kept(tmp_path):
    manifest = write_dataset(tmp_path / "ds", [sentences(3)])
    writer = DatasetWriter(tmp_path / "ds", S.SENTENCES, stage="test", params={}, fingerprint="fp1")
    assert writer.complete and writer.is_done(0)
    assert writer.finalize(1) == manifest
    changed = DatasetWriter(
        tmp_path / "ds", S.SENTENCES, stage="test", params={}, fingerprint="fp2"
    )
    assert not changed.complete and not (tmp_path / "ds" / "_manifest.json").exists()


def test_nulls_in_required_column_are_rejected(tmp_path):
    writer = DatasetWriter(tmp_path / "ds", S.SENTENCES, stage="t", params={}, fingerprint="f")
    table = sentences(2).set_column(1, S.TEXT, pa.array(["a", None]))
    with pytest.raises(S.SchemaError, match="column 'text' has 1 nulls"):
        writer.write(0, table)
