"""The key-value cache shared by processes: several processes that open a new cache file at the
same moment (Dask workers starting a stage) all get it, and each sees what the others wrote."""

from __future__ import annotations

import multiprocessing
import sqlite3

from pairforge.pipeline.plumbing.cache import KeyValueCache, _set_up


def _open_and_write(path: str, worker: int, start) -> int:
    start.wait()  # every process opens the new file at once
    cache = KeyValueCache(path, "translations")
    cache.put_many({f"k{worker}": {"text": f"value {worker}"}})
    return len(cache.get_many([f"k{worker}"]))


def test_processes_opening_a_new_cache_together_all_get_it(tmp_path):
    path = str(tmp_path / "cache.sqlite")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        start = manager.Barrier(6)
        with ctx.Pool(6) as pool:
            found = pool.starmap(_open_and_write, [(path, i, start) for i in range(6)])
    assert found == [1] * 6
    everything = KeyValueCache(path, "translations").get_many(f"k{i}" for i in range(6))
    assert everything == {f"k{i}": {"text": f"value {i}"} for i in range(6)}


def test_set_up_waits_for_a_writer_that_holds_the_file(tmp_path):
    """A connection that holds the file's write lock makes the set-up wait, not fail."""
    import threading

    path = tmp_path / "cache.sqlite"
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN EXCLUSIVE")
    threading.Timer(0.5, holder.rollback).start()
    conn = sqlite3.connect(path, timeout=0.05)  # the busy handler alone gives up at once
    _set_up(conn, "entries")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 0
