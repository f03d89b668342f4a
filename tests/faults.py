"""Kill a ``pairforge`` command at a named point of its finishing step, as SIGKILL would.

    python -m tests.faults POINT -- pairforge-args...

POINT is ``manifest:N`` (right after the N-th ``_manifest.json`` of the run is written),
``premanifest:N`` (right before it is written: every shard finished, the dataset not),
``progress:N`` (right after the N-th ``_progress/`` folder is removed), ``work:N`` (right after
the N-th ``_work/`` folder is removed), ``metrics`` (right before the metrics file is written)
or ``cache:N`` (right after the first persistent-cache write that follows the N-th shard's
``_progress/`` record: a shard part-way, some of its batches cached, itself not written).
The process ends with ``os._exit(137)``: no ``finally``, no atexit, like a kill. The injection is
here, not in the project: the project's code has no fault hooks.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

KILLED = 137


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(KILLED)


def install(point: str) -> None:
    """Patch the write and remove functions the stages finish with, to die at ``point``."""
    kind, _, nth = point.partition(":")
    if kind not in ("manifest", "premanifest", "progress", "work", "metrics", "cache"):
        raise SystemExit(f"unknown fault point {point!r}")
    target = int(nth or 1)
    seen = {"manifest": 0, "progress": 0, "work": 0, "finished": 0}

    import pairforge.pipeline.plumbing.cache as cache
    import pairforge.pipeline.plumbing.shards as shards

    real_put = cache.KeyValueCache.put_many

    def put_many(self, *args, **kwargs):
        real_put(self, *args, **kwargs)
        if kind == "cache" and seen["finished"] >= target:
            _die()

    cache.KeyValueCache.put_many = put_many

    real_json = shards.atomic_write_json

    def write_json(path, obj, *args, **kwargs):
        path = Path(path)
        if kind == "metrics" and path.parent.name == "metrics":
            _die()
        last = path.name == shards.MANIFEST and seen["manifest"] + 1 == target
        if kind == "premanifest" and last:
            _die()
        real_json(path, obj, *args, **kwargs)
        if path.parent.name == shards.PROGRESS and path.name.startswith("part-"):
            seen["finished"] += 1
        if path.name == shards.MANIFEST:
            seen["manifest"] += 1
            if kind == "manifest" and last:
                _die()

    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        real_rmtree(path, *args, **kwargs)
        name = {shards.PROGRESS: "progress", "_work": "work"}.get(Path(path).name)
        if name is not None:
            seen[name] += 1
            if kind == name and seen[name] == target:
                _die()

    shutil.rmtree = rmtree
    # Every module that imported the writer by name gets the dying one.
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("pairforge.") and (
            getattr(module, "atomic_write_json", None) is real_json
        ):
            module.atomic_write_json = write_json


def main(argv: list[str]) -> None:
    point, sep, *args = argv
    assert sep == "--", "usage: python -m tests.faults POINT -- ARGS"
    # Load the command's modules first so that their imported names can be patched.
    import pairforge.stages.embed.stage  # noqa: F401
    import pairforge.stages.ingest.stage  # noqa: F401
    import pairforge.stages.mine.stage  # noqa: F401
    import pairforge.stages.sample.stage  # noqa: F401
    from pairforge.stages.cli import app

    install(point)
    app(args, prog_name="pairforge")


if __name__ == "__main__":
    main(sys.argv[1:])
