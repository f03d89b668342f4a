"""A persistent key-value cache in one SQLite file, shared by runs, corpora and processes.

Keys are hex digests of a canonical JSON description of the work (``cache_key``): for a
translation the model and its revision, the engine and compute type, the decoding settings, the
length limits and the source text; for an LLM call the endpoint model, the rendered messages and
the sampling settings. Values are JSON. A rerun, or a corpus that overlaps an earlier one, finds
its translations here and pays nothing twice.

Writes are committed per batch, so a killed run keeps what it finished. The file is opened in
WAL mode with a busy timeout, so several Dask worker processes can share it. The cache object is
picklable: it holds only the path and reopens the connection in each process.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pairforge.pipeline.plumbing.shards import canonical_json

_CHUNK = 500  # SQLite limits the number of host parameters per statement
_TIMEOUT = 60.0  # seconds a process waits for another's write


def _set_up(conn: sqlite3.Connection, table: str) -> None:
    """WAL mode and the table, retried while another process holds the file: switching the
    journal mode of a file that another connection is creating can fail at once with "database
    is locked" (SQLite does not call its busy handler there), as two Dask workers opening a new
    cache together showed."""
    deadline = time.monotonic() + _TIMEOUT
    wait = 0.01
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            conn.commit()
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise
            conn.rollback()
            time.sleep(wait * (1 + random.random()))
            wait = min(wait * 2, 0.5)


def cache_key(payload: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``payload``."""
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


class KeyValueCache:
    """``get_many``/``put_many`` over one table of a SQLite file (created on first use)."""

    def __init__(self, path: str | Path, table: str = "entries") -> None:
        if not table.isidentifier():
            raise ValueError(f"cache table name {table!r} is not an identifier")
        self.path = Path(path)
        self.table = table
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "table": self.table}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["table"])

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=_TIMEOUT, check_same_thread=False)
            _set_up(conn, self.table)
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The cached values of those ``keys`` that are present."""
        keys = list(dict.fromkeys(keys))
        found: dict[str, Any] = {}
        with self._lock:
            conn = self._connection()
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, value FROM {self.table} WHERE key IN ({marks})", chunk
                )
                found.update((k, json.loads(v)) for k, v in rows)
        return found

    def put_many(self, items: dict[str, Any]) -> None:
        """Store ``items`` in one transaction; an existing key keeps its first value."""
        if not items:
            return
        rows = [(k, json.dumps(v, ensure_ascii=False)) for k, v in items.items()]
        with self._lock:
            conn = self._connection()
            with conn:
                conn.executemany(
                    f"INSERT OR IGNORE INTO {self.table} (key, value) VALUES (?, ?)", rows
                )

    def __len__(self) -> int:
        with self._lock:
            return self._connection().execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class MemoryCache:
    """The same interface in memory (tests, and ``cache: null`` in params: no persistence)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, items: dict[str, Any]) -> None:
        for k, v in items.items():
            self.data.setdefault(k, v)

    def __len__(self) -> int:
        return len(self.data)
