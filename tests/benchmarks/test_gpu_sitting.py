"""The GPU sitting's preparation (benchmarks/gpu_sitting.py) on the CPU: the archive split into
parts that fit a device call, received and joined as the device does, checked byte for byte; the
deadline that keeps finished runs; records brought back only where they belong. No training and
no device here: the quality driver's own tests cover its runs."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "gpu_sitting", Path(__file__).resolve().parents[2] / "benchmarks/gpu_sitting.py"
)
sitting = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = sitting
SPEC.loader.exec_module(sitting)


@pytest.fixture
def mined(tmp_path) -> Path:
    """A quality run folder as ``--mine-only`` leaves it (Apertium positives), small."""
    out = tmp_path / "quality"
    pipeline = out / "pipeline-apertium"
    for name in ("calibrated", "peer"):
        pairs = pipeline / f"data/pairs-{name}"
        (pairs / "data").mkdir(parents=True)
        (pairs / "_manifest.json").write_text(json.dumps({"name": name}))
        (pairs / "data/part-00000.parquet").write_bytes(bytes(range(256)) * 300)
    (pipeline / "params.yaml").write_text("train: {}\nevaluate: {}\n")
    (out / "mining.json").write_text(json.dumps({"complete": True}))
    return out


@pytest.fixture
def package(tmp_path) -> Path:
    """A start encoder's package: random bytes (incompressible), so the archive needs parts."""
    pkg = tmp_path / "site-packages" / "tiny_encoder"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def get_model_path(): ...\n")
    (pkg / "model/model.safetensors").write_bytes(__import__("os").urandom(300_000))
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__/x.pyc").write_bytes(b"bytecode")
    return pkg


@pytest.fixture
def shared(tmp_path) -> Path:
    root = tmp_path / "shared"
    (root / "sts").mkdir(parents=True)
    (root / "sts/stsb.tsv").write_text("a\tb\t1.0\n" * 100)
    return root


def pack(mined, package, shared, into, rows=("simcse", "peer"), part_mib=0.1):
    return sitting.pack(mined, list(rows), [1, 2], ["cls"], "apertium", into, part_mib,
                        wheels=[], package=package, shared=shared)  # fmt: skip


def test_parts_fit_and_join_to_the_same_bytes(mined, package, shared, tmp_path):
    into, home = tmp_path / "sitting", tmp_path / "device"
    manifest = pack(mined, package, shared, into)
    parts = manifest["parts"]
    assert len(parts) >= 3  # 300 KB of random bytes in parts of 0.1 MiB
    assert all(p["bytes"] <= 0.1 * sitting.MIB for p in parts)
    assert manifest["settings"] == "s500-b64-lr3e-05-e25-devall-testall-bf16-apertium"
    # The device receives each part in its own call, in any order.
    for part in reversed(parts):
        sitting.receive(into / f"part-{part['part']}", home)
    tree = sitting.assemble(home)
    model = tree / "site/tiny_encoder/model/model.safetensors"
    assert model.read_bytes() == (package / "model/model.safetensors").read_bytes()
    assert not (tree / "site/tiny_encoder/__pycache__").exists()  # bytecode stays behind
    for name in ("calibrated", "peer"):  # the rows' pairs: simcse's and the peer's
        assert (tree / f"run/pipeline-apertium/data/pairs-{name}/_manifest.json").exists()
    assert (tree / "run/mining.json").exists() and (tree / "shared/sts/stsb.tsv").exists()


def test_a_missing_or_damaged_part_is_a_clear_error(mined, package, shared, tmp_path):
    into, home = tmp_path / "sitting", tmp_path / "device"
    manifest = pack(mined, package, shared, into)
    sitting.receive(into / "part-1", home)
    with pytest.raises(SystemExit, match=r"parts \[2, 3"):
        sitting.assemble(home)
    damaged = into / "part-2" / "chunk"
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(SystemExit, match="does not match any part"):
        sitting.receive(into / "part-2", home)
    # A chunk kept from another sitting is dropped when a new sitting's part arrives.
    (home / "chunk-9").write_bytes(b"old")
    other = dict(manifest, archive_sha256="0" * 64)
    (home / "sitting.json").write_text(json.dumps(other))
    sitting.receive(into / "part-1", home)
    assert sorted(p.name for p in home.glob("chunk-*")) == ["chunk-1"]


def test_pack_needs_the_rows_pairs_mined_first(mined, package, shared, tmp_path):
    with pytest.raises(SystemExit, match="mine first.*missing pairs: knn_posaware"):
        pack(mined, package, shared, tmp_path / "s", rows=("simcse", "knn_posaware"))


def test_parts_outside_the_checkout_cannot_be_carried(tmp_path):
    with pytest.raises(SystemExit, match="outside the checkout"):
        sitting.device_calls({"parts": [{"part": 1}]}, tmp_path / "sitting")


def test_the_device_calls_carry_one_part_each_and_the_last_runs(mined, package, shared, tmp_path):
    into = sitting.ROOT / ".sitting-test"
    try:
        manifest = pack(mined, package, shared, into)
        calls = sitting.device_calls(manifest, into, budget=500)
    finally:
        import shutil

        shutil.rmtree(into, ignore_errors=True)
    assert [c["carry"] for c in calls] == [
        [f".sitting-test/part-{p['part']}"] for p in manifest["parts"]
    ]
    assert all("receive .sitting-test/part-" in c["command"] for c in calls)
    assert all("run" not in c["command"].split("&&")[-1] for c in calls[:-1])
    assert calls[-1]["command"].endswith("gpu_sitting.py run --budget 500")
    assert calls[-1]["timeout_s"] == 600 and all(len(c["command"]) <= 2000 for c in calls)


def test_the_packed_jobs_and_repeat_reach_the_device_runs(mined, package, shared, tmp_path):
    default = pack(mined, package, shared, tmp_path / "a")
    cmds = sitting.quality_commands(default, tmp_path, tmp_path / "r", tmp_path / "rr")
    assert list(cmds) == ["table"]  # the repeat was measured: asked for, not by default
    assert "--mean-rows" not in cmds["table"]  # the driver's default
    assert cmds["table"][cmds["table"].index("--jobs") + 1] == str(sitting.DEVICE_JOBS)
    assert cmds["table"][-2:] == ["--settle-steps", str(sitting.SETTLE_STEPS)]
    assert cmds["table"][cmds["table"].index("--seeds") + 1 :][:2] == ["1", "2"]
    later = sitting.pack(mined, ["simcse"], [4], ["cls"], "apertium", tmp_path / "b", 0.1,
                         wheels=[], package=package, shared=shared, jobs=5,
                         repeat=True, settle_steps=None,
                         mean_rows=["simcse", "ipw_calibrated"])  # fmt: skip
    cmds = sitting.quality_commands(later, tmp_path, tmp_path / "r", tmp_path / "rr")
    assert sorted(cmds) == ["repeat", "table"]
    assert cmds["repeat"][cmds["repeat"].index("--rows") + 1 :][:1] == ["simcse"]
    assert cmds["table"][cmds["table"].index("--jobs") + 1] == "5"
    assert cmds["table"].count("--jobs") == 1 and "--settle-steps" not in cmds["table"]
    assert "--also-steps" not in cmds["table"]
    i = cmds["table"].index("--mean-rows")  # the rows the mean start trains, as packed
    assert cmds["table"][i + 1 : i + 3] == ["simcse", "ipw_calibrated"]
    longer = sitting.pack(mined, ["ipw_calibrated"], [1], ["cls"], "apertium", tmp_path / "c",
                          0.1, wheels=[], package=package, shared=shared,
                          also_steps=1000)  # fmt: skip
    cmds = sitting.quality_commands(longer, tmp_path, tmp_path / "r", tmp_path / "rr")
    assert cmds["table"][-4:] == ["--settle-steps", str(sitting.SETTLE_STEPS), "--also-steps",
                                  "1000"]  # fmt: skip


@pytest.mark.slow
def test_the_deadline_ends_what_is_still_running_and_keeps_what_finished(tmp_path):
    done = tmp_path / "done.txt"
    cmds = {
        "quick": [sys.executable, "-c", f"open({str(done)!r}, 'w').write('ok')"],
        "slow": [sys.executable, "-c", "import time; time.sleep(60)"],
    }
    t0 = time.monotonic()
    ticks = []
    codes = sitting.run_until(
        cmds, t0 + 3.5, {}, tmp_path / "logs", every=(1.0, lambda: ticks.append(1))
    )
    assert time.monotonic() - t0 < 30
    assert len(ticks) >= 2  # the snapshots meanwhile
    assert codes["quick"] == 0 and done.read_text() == "ok"
    assert codes["slow"] < 0  # ended by a signal
    assert (tmp_path / "logs/slow.log").exists()


def test_unpack_writes_records_only_under_their_settings(tmp_path):
    archive = tmp_path / "records.tar.gz"
    members = {
        "records/s500-x/simcse/cls/seed1.json": b'{"avg": 1}',
        "records-repeat/s500-x/simcse/cls/seed1.json": b'{"avg": 2}',
        "records/s500-x/../../escape.json": b"{}",
        "records/s500-x/simcse/cls/notes.txt": b"text",
        "elsewhere/x.json": b"{}",
    }
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    records = tmp_path / "repo/records"
    written = sitting.unpack(archive, records)
    assert sorted(p.relative_to(records).as_posix() for p in written) == [
        "s500-x/repeat/simcse/cls/seed1.json",
        "s500-x/simcse/cls/seed1.json",
    ]
    assert not (tmp_path / "repo/escape.json").exists() and not (tmp_path / "escape.json").exists()


def test_a_sitting_past_one_call_runs_detached_and_later_calls_collect(
    mined, package, shared, tmp_path
):
    into = sitting.ROOT / ".sitting-test-detach"
    try:
        manifest = pack(mined, package, shared, into)
        within = sitting.device_calls(manifest, into, budget=sitting.CALL_WAIT)
        past = sitting.device_calls(manifest, into, budget=1500)
    finally:
        import shutil

        shutil.rmtree(into, ignore_errors=True)
    assert "--detach" not in within[-1]["command"] and len(within) == len(manifest["parts"])
    n = len(manifest["parts"])
    assert past[n - 1]["command"].endswith(f"run --budget 1500 --detach --wait {sitting.CALL_WAIT}")
    collects = past[n:]
    waits = [int(c["command"].rsplit(" ", 1)[1]) for c in collects]
    # the calls together wait the whole budget and the sitting's stop, each within one call
    assert sitting.CALL_WAIT + sum(waits) == 1500 + sitting.GRACE
    assert all(
        w <= sitting.CALL_WAIT and c["timeout_s"] <= 600
        for w, c in zip(waits, collects, strict=True)
    )
    assert all(
        c["carry"] == [] and "gpu_sitting.py collect --wait" in c["command"] for c in collects
    )
    with pytest.raises(SystemExit, match="within one call"):
        sitting.device_calls(manifest, sitting.ROOT, budget=1500, script="benchmarks/gpu_check.py")


def test_the_detached_sitting_outlives_its_caller_and_is_collected(tmp_path):
    import os

    home, first, later = tmp_path / "home", tmp_path / "out1", tmp_path / "out2"
    (home / "out").mkdir(parents=True)
    (home / "out/records.tar.gz").write_bytes(b"stale: another sitting's")
    script = (
        "import os, time, pathlib; time.sleep(2); out = pathlib.Path(os.environ['OUT']); "
        "(out / 'records.tar.gz').write_bytes(b'records'); (out / 'logs.tar.gz').write_bytes(b'logs')"
    )
    pid = sitting.detach([sys.executable, "-c", script], home, env={})
    assert os.getsid(pid) == pid  # a session of its own: a call's end does not take it
    assert not (home / "out/records.tar.gz").exists()  # the stale archive is gone
    running = sitting.collect(0.2, home, first)
    assert running["running"] and running["copied"] == [] and not any(first.iterdir())
    ended = sitting.collect(30, home, later)
    assert not ended["running"] and ended["copied"] == ["records.tar.gz", "logs.tar.gz"]
    assert (later / "records.tar.gz").read_bytes() == b"records"
    assert not sitting._alive(pid)  # reaped, not a zombie counted as running
    with pytest.raises(SystemExit, match="no detached sitting"):
        sitting.collect(0, tmp_path / "elsewhere", later)


def test_the_sitting_keeps_its_records_outside_the_checkout(tmp_path):
    source = tmp_path / "repo/benchmarks/results/quality"
    for settings in ("s500-a", "s500-b"):
        (source / settings / "simcse/cls").mkdir(parents=True)
        (source / settings / "simcse/cls/seed1.json").write_text(json.dumps({"s": settings}))
    records = sitting.seed_records("s500-a", tmp_path / "home", source)
    assert records == tmp_path / "home/records"
    assert json.loads((records / "s500-a/simcse/cls/seed1.json").read_text()) == {"s": "s500-a"}
    assert not (records / "s500-b").exists()  # only the sitting's settings travel along
    fresh = sitting.seed_records("s500-new", tmp_path / "home2", source)
    assert (fresh / "s500-new").is_dir() and not any((fresh / "s500-new").iterdir())
