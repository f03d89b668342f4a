"""Training checkpoints: atomic folders of everything a resumed run needs to continue exactly.

``<out>/checkpoints/step-000250/state.pt`` holds the model and objective weights (target
networks and running statistics included), optimiser, scheduler and gradient-scaler states,
every random generator (python, numpy, torch, each CUDA device; one set per rank), the data
stream's position, the best dev score so far and the training history. A checkpoint folder is
written under a temporary name and renamed into place, so a run killed at any moment leaves only
complete checkpoints; the newest one is where the next run continues. ``run.json`` records the
fingerprint of the run the checkpoints belong to: another fingerprint starts from scratch.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pairforge.pipeline.plumbing.files import atomic_write_json

CHECKPOINTS = "checkpoints"
STATE = "state.pt"
RUN_FILE = "run.json"
PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    """The state of every random generator training uses (this process only)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one training run under ``<out>/checkpoints``."""

    def __init__(self, out: str | Path, fingerprint: str, keep: int = 1) -> None:
        self.folder = Path(out) / CHECKPOINTS
        self.fingerprint = fingerprint
        self.keep = max(1, keep)

    def prepare(self) -> bool:
        """Remove temporaries; clear checkpoints of another run. True if ours may be resumed."""
        if self.folder.exists():
            for tmp in self.folder.glob(".*.tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
        run_file = self.folder / RUN_FILE
        if (
            run_file.exists()
            and json.loads(run_file.read_text()).get("fingerprint") == self.fingerprint
        ):
            return True
        self.clear()
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_file, {"fingerprint": self.fingerprint})
        return False

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def steps(self) -> list[int]:
        if not self.folder.exists():
            return []
        found = []
        for child in self.folder.glob(f"{PREFIX}*"):
            if child.is_dir() and (child / STATE).exists():
                try:
                    found.append(int(child.name[len(PREFIX) :]))
                except ValueError:
                    continue
        return sorted(found)

    def path(self, step: int) -> Path:
        return self.folder / f"{PREFIX}{step:06d}"

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` atomically, then drop all but the newest ``keep``."""
        final = self.path(step)
        tmp = self.folder / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with open(tmp / STATE, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        (tmp / "meta.json").write_text(
            json.dumps({"step": step, "fingerprint": self.fingerprint}) + "\n"
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.folder)
        for old in self.steps()[: -self.keep]:
            shutil.rmtree(self.path(old), ignore_errors=True)
        return final

    def load(self, step: int, device: str | torch.device = "cpu") -> dict[str, Any]:
        # Our own file (it holds numpy generator states and python objects), so not weights_only.
        return torch.load(self.path(step) / STATE, map_location=device, weights_only=False)
