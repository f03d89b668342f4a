"""The Apertium engine: rule-based translation through an installed language pair's pipeline.

``apertium -f line`` keeps one output line per input line, but that does not keep sentences
apart: a transfer rule matches words across the line break, so ``I have a big`` / ``cat house``
comes back as ``Tengo un gato`` / ``grande alberga`` (measured with apertium 3.8.3, eng-spa):
the line count agrees while a word has moved to the next sentence. This engine therefore runs
the mode's programs in null-flush mode (``apertium-wblank-mode -z``), where every program ends
its work at each NUL, and sends each sentence as a block of its own:

    [<index>]<escaped text><end>\\0

``<index>`` is a superblank (copied through untouched) that must come back at the head of the
block of the same index: a block lost, split or merged is an error, never a shifted positive.
``<end>`` gives the last word a sentence end, as ``apertium-destxt`` does: ``.[]`` when the
sentence does not end with a period (the added period is taken off the output), ``[]`` when it
does (without a blank after it, a final period is dropped in null-flush mode). Unknown-word marks
are off (the generator's ``-n``).

The pipeline is a long-lived process per mode and per worker process (``persistent``), or one
process per batch; ``benchmarks/backtranslate.py`` measures both.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.apertium import mode_name

_ESCAPE = re.compile(r"([\\\[\]{}^$/<>@])")
_SPACE = re.compile(r"[\s\x00-\x1f\x7f]+")
# A batch that makes no progress for this long is taken as a hung pipeline.
STALL_SECONDS = 120.0


class ApertiumError(RuntimeError):
    """The pipeline failed, hung or returned blocks that do not match the batch."""


def encode_block(index: int, text: str) -> tuple[str, bool]:
    """``(block, period added)``: ``text`` in Apertium's stream format, framed as above.
    Whitespace runs and control characters become one space; ``~`` (a post-generation mark
    to Apertium) is kept apart as a blank, as ``apertium-destxt`` keeps it."""
    text = _SPACE.sub(" ", text).strip()
    body = _ESCAPE.sub(r"\\\1", text).replace("~", "[~]")
    added = not text.endswith(".")
    return f"[{index}]{body}{'.[]' if added else '[]'}", added


def decode_block(raw: str, index: int, added: bool) -> str:
    """The translation of block ``index`` from the pipeline's output block ``raw`` (no NUL):
    the index superblank checked and dropped, escapes and blanks resolved, the added period
    taken off. Raises ApertiumError when the block is not the one of ``index``."""
    head = f"[{index}]"
    stripped = raw.lstrip()
    if not stripped.startswith(head):
        raise ApertiumError(
            f"block {index}: expected it to start with {head!r}, got {stripped[:40]!r}"
        )
    body = stripped[len(head) :].rstrip()
    if body.endswith("[]"):
        body = body[:-2]
        if added and body.endswith("."):
            body = body[:-1]
    return _SPACE.sub(" ", _unstream(body)).strip()


def _unstream(body: str) -> str:
    """Stream format to text: ``\\x`` -> ``x``, ``[blank]`` -> its content."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == "\\" and i + 1 < n:
            out.append(body[i + 1])
            i += 2
        elif c == "[":
            j = i + 1
            while j < n and body[j] != "]":
                j += 2 if body[j] == "\\" else 1
            out.append(_unstream(body[i + 1 : j]))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def pipeline_command(mode_path: Path) -> str:
    """The mode's shell pipeline with every program in null-flush mode."""
    try:
        out = subprocess.run(
            ["apertium-wblank-mode", "-z", str(mode_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(
            f"apertium mode {mode_path}: apertium-wblank-mode failed: {exc}"
        ) from None
    return out.stdout.strip()


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C.UTF-8"  # Apertium's programs read and write UTF-8 under a UTF-8 locale
    return env


class ApertiumPipeline:
    """One mode's programs as a process fed NUL-separated blocks (see the module docstring)."""

    def __init__(self, mode_path: Path, persistent: bool = True) -> None:
        self.mode_path = mode_path
        self.command = pipeline_command(mode_path)
        self.persistent = persistent
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self._finalizer = weakref.finalize(self, ApertiumPipeline._stop_process, [None])

    # -- the process -----------------------------------------------------------------------

    def _start(self) -> subprocess.Popen:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (read after the process dies)
        # $1: the generator's option (-n: no unknown-word marks); $2: the tagger's (none).
        proc = subprocess.Popen(
            ["bash", "-c", self.command, "pairforge-apertium", "-n", ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=_environment(),
            start_new_session=True,  # one process group: a stop ends every program of the pipe
        )
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, ApertiumPipeline._stop_process, [proc])
        return proc

    @staticmethod
    def _stop_process(holder: list) -> None:
        proc = holder[0]
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def close(self) -> None:
        self._finalizer()
        self._proc = None

    def _error_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace").strip()
        return text[-500:]

    # -- translation -----------------------------------------------------------------------

    def translate(self, texts: list[str]) -> list[str]:
        """One translation per text, in order."""
        if not texts:
            return []
        framed = [encode_block(i, t) for i, t in enumerate(texts)]
        payload = "".join(block + "\0" for block, _ in framed).encode("utf-8")
        if self._proc is None or self._proc.poll() is not None or not self.persistent:
            self.close()
            self._proc = self._start()
        try:
            raw = self._exchange(self._proc, payload, len(texts))
        except ApertiumError:
            self.close()
            raise
        if not self.persistent:
            self.close()
        return [
            decode_block(block.decode("utf-8", "replace"), i, added)
            for i, (block, (_, added)) in enumerate(zip(raw, framed, strict=True))
        ]

    def _exchange(self, proc: subprocess.Popen, payload: bytes, n: int) -> list[bytes]:
        """Write ``payload`` (from a thread, so a full pipe cannot deadlock) and read ``n``
        NUL-terminated blocks back."""
        assert proc.stdin is not None and proc.stdout is not None
        failure: list[BaseException] = []

        def feed() -> None:
            try:
                proc.stdin.write(payload)
                proc.stdin.flush()
                if not self.persistent:
                    proc.stdin.close()
            except (BrokenPipeError, OSError) as exc:
                failure.append(exc)

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        fd = proc.stdout.fileno()
        buffer = bytearray()
        last = time.monotonic()
        while buffer.count(b"\0") < n:
            ready, _, _ = select.select([fd], [], [], 5.0)
            if not ready:
                if proc.poll() is not None:
                    break
                if time.monotonic() - last > STALL_SECONDS:
                    back = buffer.count(b"\0")
                    raise ApertiumError(
                        f"apertium {self.mode_path.stem}: no output for {STALL_SECONDS:.0f} s "
                        f"({back} of {n} blocks back)"
                    )
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            last = time.monotonic()
        writer.join(timeout=STALL_SECONDS)
        blocks = bytes(buffer).split(b"\0")
        if len(blocks) - 1 < n:
            if not self.persistent and proc.poll() is None:
                proc.wait(timeout=10)  # its exit status belongs in the message
            raise ApertiumError(
                f"apertium {self.mode_path.stem}: {len(blocks) - 1} of {n} blocks came back "
                f"(exit {proc.poll()}): {self._error_text() or (failure[0] if failure else '')}"
            )
        extra = blocks[n:]
        if self.persistent and any(extra):
            raise ApertiumError(f"apertium {self.mode_path.stem}: output past the batch's end")
        if not self.persistent:
            # At end of input each program flushes once more: empty blocks only.
            if any(b.strip() for b in extra):
                raise ApertiumError(f"apertium {self.mode_path.stem}: output past the batch's end")
            proc.wait(timeout=60)
        return blocks[:n]


class ApertiumTranslator:
    """An ``apertium:<mode>`` spec as a text-to-text translator: deterministic, one output per
    input (greedy decoding only), no token limits. ``translate.translate_texts`` tells it from
    the Marian translators by ``text_engine``."""

    text_engine = True

    def __init__(self, ref, settings) -> None:
        self.ref = ref
        self.settings = settings
        self.mode = mode_name(ref.spec)
        self.pipeline = ApertiumPipeline(Path(ref.path))

    def translate_texts(self, texts: list[str]) -> list[str]:
        return self.pipeline.translate(texts)
