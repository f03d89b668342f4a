"""A full disk: `pairforge ingest` into a small filesystem stops with one line naming the dataset
and the file, exit 1, nothing half-written read; after space is freed the rerun finishes
byte-identical to a run on a disk with room. The filesystem is a real tmpfs of 8 MB, filled to 150 KB free (mounting
needs root, as CI runs; elsewhere the test is skipped)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import run_cli
from tests.stages.ingest.test_resume import make_project, snapshot


def _mount(folder, size: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    return done.returncode == 0


@pytest.fixture()
def small_disk(tmp_path):
    folder = tmp_path / "small"
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and _mount(folder, "8m")):
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: a tmpfs must mount")
        pytest.skip("mounting a tmpfs needs root")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_full_disk_is_one_line_and_the_rerun_after_freeing_space_is_identical(
    small_disk, tmp_path
):
    reference = tmp_path / "reference"
    make_project(reference)
    assert run_cli(["ingest", "--no-progress"], cwd=reference).returncode == 0

    make_project(small_disk)
    # Room for the corpus and little more: the stage runs out while writing its shards.
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * max(0, free - 150_000))
    result = run_cli(["ingest", "--no-progress"], cwd=small_disk)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no space left on the device"), errors
    assert "free some space and run the command again" in errors[0]
    assert " writing data/sentences/" in errors[0] and "(dataset 'data/sentences')" in errors[0]
    assert not (small_disk / "data/sentences/_manifest.json").exists()

    filler.unlink()
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_disk)], check=True)
    again = run_cli(["ingest", "--no-progress"], cwd=small_disk)
    assert again.returncode == 0, again.stderr[-2000:]
    assert snapshot(small_disk) == snapshot(reference)
