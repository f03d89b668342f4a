"""Progress of long work: a live line on a terminal, plain log lines otherwise, and a summary."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True

log = logging.getLogger("pairforge")


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


def _fmt_count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


class Progress:
    """Counts work units (shards, bytes or rows) and rows, with rate and ETA.

    ``total`` is in the same unit as ``advance(done=...)``; when it is unknown no ETA is shown.
    Already-finished work found on resume is passed as ``skipped`` so the rate covers only what
    this run computes.
    """

    def __init__(
        self,
        label: str,
        total: float | None = None,
        unit: str = "shards",
        skipped: float = 0,
        stream: TextIO | None = None,
        interval: float | None = None,
        enabled: bool = True,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.skipped = skipped
        self.done = skipped
        self.rows = 0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.2 if self.tty else 10.0)
        self.enabled = enabled
        self.start = time.monotonic()
        self._last = 0.0

    def advance(self, done: float = 0, rows: int = 0) -> None:
        self.done += done
        self.rows += rows
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self._emit(self.status())

    def status(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.rows / elapsed
        parts = [f"{self.label}:"]
        if self.total:
            pct = 100.0 * self.done / self.total if self.total else 100.0
            parts.append(
                f"{_fmt_count(self.done)}/{_fmt_count(self.total)} {self.unit} ({pct:.0f}%)"
            )
        else:
            parts.append(f"{_fmt_count(self.done)} {self.unit}")
        parts.append(f"{_fmt_count(self.rows)} rows, {_fmt_count(rate)} rows/s")
        fresh = self.done - self.skipped
        if self.total and fresh > 0:
            eta = (self.total - self.done) * elapsed / fresh
            parts.append(f"ETA {_fmt_duration(eta)}")
        return " ".join(parts)

    def _emit(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self.stream.flush()
        else:
            log.info(line)

    def close(self, summary: str | None = None) -> str:
        """End the live line and log a summary (elapsed time, rows, rate)."""
        elapsed = time.monotonic() - self.start
        rate = self.rows / elapsed if elapsed > 0 else 0.0
        line = (
            f"{self.label}: done in {_fmt_duration(elapsed)} ({elapsed:.1f}s), "
            f"{_fmt_count(self.rows)} rows at {_fmt_count(rate)} rows/s"
        )
        if self.skipped:
            line += f"; {_fmt_count(self.skipped)} {self.unit} already finished, skipped"
        if summary:
            line += f"; {summary}"
        if self.enabled and self.tty:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        if self.enabled:
            log.info(line)
        return line
