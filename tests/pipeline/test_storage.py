"""Datasets on object storage (``pipeline/plumbing/storage.py``), against a real S3-compatible
HTTP server the tests start (moto in server mode): writing, reading and verifying a dataset at an
``s3://`` URL, the same bytes as on a local disk, a writer killed mid-run and resumed, the writer
lock as an object created only if absent, a reader that never sees a partial dataset, shards
read where no filesystem is shared, and training on pairs in a bucket."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pairforge.pipeline.plumbing import locks
from pairforge.pipeline.plumbing.errors import (
    CorruptShardError,
    DataIntegrityError,
    DatasetLockedError,
    IncompleteDatasetError,
    PairforgeError,
)
from pairforge.pipeline.plumbing.schemas import SchemaSpec
from pairforge.pipeline.plumbing.shards import (
    DatasetWriter,
    open_dataset,
    read_manifest,
)
from pairforge.pipeline.plumbing.storage import RemotePath, dataset_path, is_url

from tests.conftest import ROOT, run_cli
from tests.pipeline.test_integrity import EMB16, write
from tests.train.builders import pairs_rows, write_pairs

SPEC = SchemaSpec(
    "store_test", 1, pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.string())]), "t"
)


def _table(start: int, n: int) -> pa.Table:
    return pa.table(
        {"id": list(range(start, start + n)), "text": [f"row {i}" for i in range(start, start + n)]}
    )


def _write(path, shards: int = 3, fingerprint: str = "f1") -> dict:
    writer = DatasetWriter(path, SPEC, stage="test", params={"k": 1}, fingerprint=fingerprint)
    for index in range(shards):
        if not writer.is_done(index):
            writer.write(index, _table(index * 10, 10), {"rows": 10})
    return writer.finalize(shards)


def test_a_dataset_in_a_bucket_has_the_bytes_and_manifest_of_a_local_one(bucket, tmp_path):
    url = f"{bucket}/team/sentences"
    remote = _write(url)
    local = _write(tmp_path / "sentences")
    assert remote == local  # no machine fact, no URL in the manifest
    store = dataset_path(url)
    for shard in remote["shards"]:
        assert (store / shard["file"]).read_bytes() == (
            tmp_path / "sentences" / shard["file"]
        ).read_bytes()
    assert not (store / "_progress").exists()  # the markers go once the manifest is written
    assert (store.parent / ".sentences.run.json").exists() and not (
        store.parent / ".sentences.lock"
    ).exists()

    dataset = open_dataset(url, SPEC, verify=True)
    assert dataset.read_table().equals(open_dataset(tmp_path / "sentences", SPEC).read_table())
    # A shard source carries the URL only: it reads in a process that shares no filesystem with
    # this one (its own folder, the store's address from its environment).
    source = dataset.sources()[1]
    script = "import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()).read(); print(t.num_rows, t['id'][0])"
    other = subprocess.run(
        [sys.executable, "-c", script], input=pickle.dumps(source), cwd=tmp_path,
        capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
    )  # fmt: skip
    assert other.returncode == 0, other.stderr.decode()
    assert other.stdout.decode().split() == ["10", "10"]

    verified = run_cli(["verify", url], cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert f"{url}: ok: 3 shards, 30 rows" in verified.stdout


def test_no_reader_starts_arrows_thread_pool(tmp_path):
    # A process that had read from a store and decoded on Arrow's thread pool could abort at exit
    # after its work (exit -6: apache/arrow#34314), so every reader decodes on the reading thread,
    # without pre-buffering (which reads a local file on Arrow's I/O pool): the verified shard read,
    # mining's embeddings reader, the trainer's row stream and ingest's Parquet corpus reader. The
    # process's thread count after them is the count before; after pyarrow's own read it is higher
    # (the count sees a pool start).
    _write(tmp_path / "sentences")
    write(tmp_path / "emb", EMB16)
    write_pairs(tmp_path / "pairs", pairs_rows([f"sentence number {i} here" for i in range(40)]))
    pq.write_table(
        pa.table({"text": [f"line {i}" for i in range(30)]}), tmp_path / "corpus.parquet"
    )
    for file in tmp_path.rglob("*"):  # a minute old: local shards read from their path, verified
        os.utime(file, (file.stat().st_atime - 60, file.stat().st_mtime - 60))
    script = textwrap.dedent(f"""
        import os
        import pyarrow.parquet as pq
        from tests.pipeline.test_integrity import EMB16
        from tests.pipeline.test_storage import SPEC
        from pairforge.pipeline.plumbing import schemas as S
        from pairforge.pipeline.plumbing.shards import open_dataset
        from pairforge.pipeline.science.mining_inputs import iter_vectors, open_embeddings
        from pairforge.pipeline.science.readers import read_blocks, resolve_inputs
        from pairforge.train.data import PairsSource, RowStream

        def threads():
            return len(os.listdir("/proc/self/task"))

        folder = {str(tmp_path)!r}
        before, rows = threads(), []
        rows.append(open_dataset(folder + "/sentences", SPEC, verify=True).read_table().num_rows)
        rows.append(sum(len(ids) for ids, _ in iter_vectors(open_embeddings(folder + "/emb"), 0)))
        source = PairsSource(folder + "/pairs").select([S.TEXT])
        rows.append(len(RowStream(source, buffer_size=8, seed=1).take(25)))
        files = resolve_inputs([folder + "/corpus.parquet"])
        rows.append(sum(len(block) for block in read_blocks(files, "text", 1 << 16)))
        after = threads()
        pq.read_table(folder + "/sentences/data")
        print(*rows, after - before, threads() > after)
    """)
    other = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == ["30", "40", "25", "30", "0", "True"]


def test_a_writer_killed_in_a_bucket_resumes_and_no_reader_sees_the_partial_dataset(
    bucket, tmp_path, caplog
):
    url = f"{bucket}/pairs"
    # A writer process killed after its second shard: its markers and its lock object remain.
    script = textwrap.dedent(f"""
        import os, pyarrow as pa
        from tests.pipeline.test_storage import SPEC, _table
        from pairforge.pipeline.plumbing.shards import DatasetWriter
        w = DatasetWriter({url!r}, SPEC, stage="test", params={{"k": 1}}, fingerprint="f1")
        for i in range(2):
            w.write(i, _table(i * 10, 10), {{"rows": 10}})
        os._exit(9)
    """)
    killed = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120
    )
    assert killed.returncode == 9, killed.stderr.decode()
    store = dataset_path(url)
    assert (store.parent / ".pairs.lock").exists()
    assert sorted(p.name for p in (store / "_progress").iterdir()) == [
        "part-00000.json",
        "part-00001.json",
        "run.json",
    ]
    with pytest.raises(IncompleteDatasetError, match="its stage was interrupted"):
        read_manifest(url)
    verify = run_cli(["verify", url], cwd=tmp_path)
    assert verify.returncode == 1 and "is not complete" in verify.stdout

    # The rerun takes over the dead writer's lock, keeps its two shards and writes the third.
    writer = DatasetWriter(url, SPEC, stage="test", params={"k": 1}, fingerprint="f1")
    assert "taking over a stale lock" in caplog.text
    assert writer.is_done(0) and writer.is_done(1) and not writer.is_done(2)
    first = (store / "data/part-00000.parquet").read_bytes()
    writer.write(2, _table(20, 10), {"rows": 10})
    manifest = writer.finalize(3)
    assert manifest == _write(tmp_path / "local")  # as if never killed
    assert (store / "data/part-00000.parquet").read_bytes() == first


def test_the_lock_object_refuses_a_second_writer_and_names_the_holder(bucket):
    url = f"{bucket}/pairs"
    lock = dataset_path(url).parent / ".pairs.lock"
    lock.write_bytes(json.dumps({"pid": 4242, "host": "miner-7", "since": "2026-11-28T06:00:00Z",
                                 "command": "pairforge sample"}).encode())  # fmt: skip
    with pytest.raises(
        DatasetLockedError, match=r"another writer holds it \(pid 4242 on miner-7"
    ) as err:
        DatasetWriter(url, SPEC, stage="test", params={}, fingerprint="f")
    assert str(lock) in str(err.value)
    lock.unlink()
    writer = DatasetWriter(url, SPEC, stage="test", params={}, fingerprint="f")
    assert lock.exists() and str(lock) in locks.held()
    assert lock.create(b"{}") is False  # created only if absent: what a second process meets
    writer.close()
    assert not lock.exists() and str(lock) not in locks.held()


def test_a_shard_changed_in_the_bucket_and_a_manifest_leaving_it_are_refused(bucket, tmp_path):
    url = f"{bucket}/sentences"
    manifest = _write(url)
    store = dataset_path(url)
    shard = store / manifest["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="part-00001.parquet is corrupt"):
        open_dataset(url, SPEC).read_shard(1)
    verify = run_cli(["verify", url], cwd=tmp_path)
    assert verify.returncode == 1 and "sha256 mismatch" in verify.stdout

    manifest["shards"][0]["file"] = "../victim/secret.parquet"
    (store / "_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataIntegrityError, match="a path that leaves the dataset"):
        open_dataset(url, SPEC)


def test_urls_and_local_paths():
    assert is_url("s3://b/k") and is_url("gs://b") and not is_url("data/pairs")
    assert not is_url("file:///tmp/x") and str(dataset_path("file:///tmp/x")) == "/tmp/x"
    path = RemotePath("s3://b/a/pairs")
    assert (
        path.name == "pairs"
        and str(path.parent) == "s3://b/a"
        and str(path / "data") == "s3://b/a/pairs/data"
    )
    assert pickle.loads(pickle.dumps(path)) == path


def test_an_unknown_store_is_one_line(tmp_path):
    done = run_cli(["verify", "nosuch://bucket/pairs"], cwd=tmp_path)
    assert done.returncode == 1
    assert "nosuch://bucket/pairs: Protocol not known: nosuch" in done.stdout
    trained = run_cli(["train", "--input", "nosuch://bucket/pairs"], cwd=tmp_path)
    assert trained.returncode == 2, trained.stderr
    assert trained.stderr.strip().splitlines()[-1] == (
        "error: nosuch://bucket/pairs: Protocol not known: nosuch"
    )


def test_train_reads_its_pairs_from_a_bucket(
    bucket, tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    url = f"{bucket}/pairs"
    write_pairs(url, pairs_rows(tiny_sentences), rows_per_shard=4)
    cache = tmp_path / "pairforge-cache"
    trained = run_cli(
        ["train", "--input", url, "--model", str(tiny_model_dir), "--max-steps", "2",
         "--batch-size", "4", "--max-length", "16", "--eval-every", "2", "--sts-dir",
         str(sts_dir), "--threads", "1", "--no-progress"],
        cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert (tmp_path / "models/simcse/model/pairforge.json").exists()
    assert len(list((cache / "shards").glob("*.parquet"))) == len(read_manifest(url)["shards"])


def test_ingest_writes_to_a_bucket_what_it_writes_on_disk(bucket, tmp_path):
    """A stage's outputs at URLs: ingest's sentences and quarantine, computed on 2 Dask workers
    whose scratch chunks go to the store and are removed; a rerun finds both complete."""
    (tmp_path / "corpus.txt").write_text(
        "".join(f"Sentence number {i} is about topic {i % 7} today.\n" for i in range(120))
        + "short\n" + "Sentence number 3 is about topic 3 today.\n"
    )  # fmt: skip
    args = ["ingest", "--profile", "demo", "--root", ".", "--input", "corpus.txt",
            "--rows-per-shard", "50", "--no-progress"]  # fmt: skip
    local = run_cli([*args, "--output", "out/sentences", "--quarantine", "out/quarantine"],
                    cwd=tmp_path)  # fmt: skip
    assert local.returncode == 0, local.stderr
    # On 2 Dask workers, whose scratch chunks go under the output in the store (no shared folder).
    stored = run_cli([*args, "--output", f"{bucket}/sentences", "--quarantine",
                      f"{bucket}/quarantine", "--workers", "2"], cwd=tmp_path)  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    for name in ("sentences", "quarantine"):
        on_disk = read_manifest(tmp_path / "out" / name)["shards"]
        in_bucket = read_manifest(f"{bucket}/{name}")["shards"]
        assert [s["sha256"] for s in in_bucket] == [s["sha256"] for s in on_disk], name
    assert read_manifest(f"{bucket}/sentences")["rows"] == 120
    assert read_manifest(f"{bucket}/quarantine")["rows"] == 2  # too short, duplicate
    assert not (tmp_path / "pairforge-cache").exists()  # nothing local: scratch went to the store
    assert not (dataset_path(f"{bucket}/sentences") / "_work").exists()  # and was removed
    again = run_cli([*args, "--output", f"{bucket}/sentences", "--quarantine",
                     f"{bucket}/quarantine"], cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0 and "cleaned" not in again.stderr, again.stderr


def test_a_dataset_served_over_http_is_read_and_verified_and_writing_there_is_one_line(tmp_path):
    """A read-only store (fsspec's HTTP filesystem over a local http.server): reads and verify
    work; a writer is refused at its lock with one line, before anything is written."""
    import functools
    import http.server
    import threading

    _write(tmp_path / "site" / "sentences")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=tmp_path / "site")
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/sentences"
        assert open_dataset(url, SPEC, verify=True).read_table().num_rows == 30
        verified = run_cli(["verify", url], cwd=tmp_path)
        assert verified.returncode == 0 and f"{url}: ok: 3 shards" in verified.stdout
        with pytest.raises(PairforgeError, match=r"cannot write the lock object .*\.copy\.lock"):
            DatasetWriter(url.replace("sentences", "copy"), SPEC, stage="test", params={},
                          fingerprint="f")  # fmt: skip
        assert not (tmp_path / "site" / ".copy.lock").exists()
        assert not any(key.startswith("http") for key in locks.held())
    finally:
        server.shutdown()
