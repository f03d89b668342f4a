"""Semantic textual similarity evaluation as SentEval computes it for SimCSE and its successors.

Tasks and files (under a data folder laid out as ``shared/data/sts``, see ``DOWNLOAD``):

- ``sts12`` .. ``sts16``: ``stsNN/STS.input.<subset>.txt`` (``sentence1<TAB>sentence2``) and
  ``stsNN/STS.gs.<subset>.txt`` (one gold score per line; empty = not scored, the pair is dropped,
  as SentEval does). The score is SentEval's **"all"** aggregation, SimCSE's convention: one
  Spearman correlation over the concatenation of every subset's pairs. The per-subset
  correlations, their mean and their pair-weighted mean are reported beside it.
- ``stsb`` / ``stsb_dev``: STS-Benchmark test / dev, ``stsb/sts-{test,dev}.csv``: tab-separated,
  score in column 5, sentences in columns 6-7.
- ``sickr`` / ``sickr_dev``: SICK-Relatedness test / trial (SentEval's dev split),
  ``sickr/SICK_{test_annotated,trial}.txt``: a header line, then ``pair_ID, sentence_A,
  sentence_B, relatedness_score, ...`` tab-separated (CRLF tolerated).
- ``demo_dev`` / ``demo_test``: the demo evaluation set shipped with the project
  (``data/demo/eval/{dev,test}.tsv``, see its README), in STS-B's layout (score in column 5,
  sentences in columns 6-7; column 1 the topic, column 2 the kind of pair). Its folder is not the
  STS folder: the demo runs without the STS data, which cannot be shipped.

The score of a task is 100 x the Spearman correlation between the cosine similarity of the two
sentences' vectors and the gold scores. Alignment and uniformity (Wang and Isola, 2020) follow
SimCSE: alignment over STS-B test pairs with gold > 4, uniformity over all STS-B test sentences,
on L2-normalised vectors (lower is better for both).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError

STS_SUBSETS: dict[str, tuple[str, ...]] = {
    "sts12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "sts13": ("FNWN", "headlines", "OnWN"),
    "sts14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "sts15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "sts16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
BENCHMARK_FILES: dict[str, str] = {
    "stsb": "stsb/sts-test.csv",
    "stsb_dev": "stsb/sts-dev.csv",
    "sickr": "sickr/SICK_test_annotated.txt",
    "sickr_dev": "sickr/SICK_trial.txt",
}
# The demo evaluation set: read from its own folder, never from the STS folder.
DEMO_FILES: dict[str, str] = {"demo_dev": "dev.tsv", "demo_test": "test.tsv"}
DEMO_TASKS = tuple(DEMO_FILES)
TEST_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
DEV_TASKS = ("stsb_dev", "sickr_dev")
TASKS = (*TEST_TASKS, *DEV_TASKS, *DEMO_TASKS)
LABELS = {
    "sts12": "STS12",
    "sts13": "STS13",
    "sts14": "STS14",
    "sts15": "STS15",
    "sts16": "STS16",
    "stsb": "STS-B",
    "sickr": "SICK-R",
    "stsb_dev": "STS-B dev",
    "sickr_dev": "SICK-R dev",
    "demo_dev": "Demo dev",
    "demo_test": "Demo test",
}
DOWNLOAD = (
    "get the SentEval STS data (STS12-16, STS-B, SICK) with SentEval's script: "
    "git clone https://github.com/facebookresearch/SentEval && "
    "(cd SentEval/data/downstream && bash get_transfer_data.bash), then lay it out as "
    "<data>/sts12..sts16/STS.{input,gs}.<subset>.txt, <data>/stsb/sts-{dev,test}.csv, "
    "<data>/sickr/SICK_{trial,test_annotated}.txt (the layout of shared/data/sts; see "
    "`pairforge evaluate --help`)"
)

Embed = Callable[[Sequence[str]], np.ndarray]


@dataclass
class STSData:
    """The scored pairs of one task; ``subset`` indexes ``subsets`` for each pair."""

    task: str
    s1: list[str]
    s2: list[str]
    gold: np.ndarray  # (n,) float64
    subset: np.ndarray  # (n,) int
    subsets: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.s1)

    def take(self, index: np.ndarray) -> STSData:
        return STSData(
            self.task,
            [self.s1[i] for i in index],
            [self.s2[i] for i in index],
            self.gold[index],
            self.subset[index],
            self.subsets,
        )


def data_folder(spec: str | Path) -> Path:
    """The STS data folder named by ``spec``, environment variables expanded
    (``$PAIRFORGE_SHARED_DATA/sts``); a ConfigError naming an unset variable or a missing folder."""
    expanded = os.path.expandvars(str(spec))
    if "$" in expanded:
        raise ConfigError(
            f"STS data folder {str(spec)!r} names an unset environment variable; {DOWNLOAD}"
        )
    path = Path(expanded).expanduser()
    if not path.is_dir():
        raise ConfigError(f"STS data folder {str(path)!r} does not exist; {DOWNLOAD}")
    return path


def find_data_folder(spec: str | Path) -> Path | None:
    """The STS data folder named by ``spec`` (as ``data_folder``), or None when it is absent:
    the folder does not exist or ``spec`` names an unset environment variable."""
    try:
        return data_folder(spec)
    except ConfigError:
        return None


def task_folder(task: str, sts_dir: str | Path | None, demo_dir: str | Path | None) -> Path:
    """The folder holding ``task``'s files: ``demo_dir`` for the demo set, else the STS folder
    ``sts_dir`` (checked by ``data_folder``); a ConfigError naming the missing setting."""
    if task in DEMO_TASKS:
        if not demo_dir:
            raise ConfigError(f"task {task!r} needs the demo evaluation set's folder (demo_dir)")
        return Path(demo_dir)
    if not sts_dir:
        raise ConfigError(f"task {task!r} needs the STS data folder; {DOWNLOAD}")
    return data_folder(sts_dir)


def task_files(root: str | Path, task: str) -> list[Path]:
    """The files ``load_task(root, task)`` reads, in a fixed order."""
    root = Path(root)
    if task in STS_SUBSETS:
        return [
            root / task / f"STS.{kind}.{name}.txt"
            for name in STS_SUBSETS[task]
            for kind in ("input", "gs")
        ]
    if task in DEMO_FILES:
        return [root / DEMO_FILES[task]]
    if task in BENCHMARK_FILES:
        return [root / BENCHMARK_FILES[task]]
    raise PairforgeError(f"unknown STS task {task!r}; known: {', '.join(TASKS)}")


def _read_lines(path: Path, demo: bool = False) -> list[str]:
    if not path.is_file():
        if demo:
            raise PairforgeError(
                f"demo evaluation file {str(path)!r} not found; the set ships with the project "
                "in data/demo/eval (point train.demo_dir / evaluate.demo_data at that folder)"
            )
        raise PairforgeError(f"STS file {str(path)!r} not found; {DOWNLOAD}")
    # splitlines, as SentEval reads these files (it also ends lines at \r).
    return path.read_text(encoding="utf-8").splitlines()


def _score(value: str, where: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise PairforgeError(f"{where}: gold score {value!r} is not a number") from None


def load_task(root: str | Path, task: str) -> STSData:
    """The scored pairs of ``task`` (one of ``TASKS``) from the data folder ``root`` (the demo
    set's folder for ``DEMO_TASKS``, see ``task_folder``).

    A missing file or a gold file whose length differs from its input file is a PairforgeError
    naming the file (and how to get the data).
    """
    root = Path(root)
    if task in STS_SUBSETS:
        s1: list[str] = []
        s2: list[str] = []
        gold: list[float] = []
        subset: list[int] = []
        for k, name in enumerate(STS_SUBSETS[task]):
            inputs_path = root / task / f"STS.input.{name}.txt"
            gold_path = root / task / f"STS.gs.{name}.txt"
            inputs, scores = _read_lines(inputs_path), _read_lines(gold_path)
            if len(inputs) != len(scores):
                raise PairforgeError(
                    f"{str(gold_path)!r} has {len(scores)} lines but {str(inputs_path)!r} has "
                    f"{len(inputs)}; they must be aligned line by line"
                )
            for number, (line, score) in enumerate(zip(inputs, scores, strict=True), 1):
                if not score.strip():
                    continue  # not scored (STS15/16): SentEval drops the pair
                columns = line.split("\t")
                if len(columns) < 2:
                    raise PairforgeError(
                        f"{inputs_path}:{number}: expected two tab-separated sentences"
                    )
                s1.append(columns[0])
                s2.append(columns[1])
                gold.append(_score(score.strip(), f"{gold_path}:{number}"))
                subset.append(k)
        return STSData(task, s1, s2, np.array(gold), np.array(subset, dtype=int), STS_SUBSETS[task])
    (path,) = task_files(root, task)
    lines = _read_lines(path, demo=task in DEMO_TASKS)
    if task.startswith("sickr"):
        lines, (i1, i2, ig) = lines[1:], (1, 2, 3)
        first = 2
    else:
        i1, i2, ig = 5, 6, 4
        first = 1
    s1, s2, gold = [], [], []
    for number, line in enumerate(lines, first):
        columns = line.strip().split("\t")
        if not line.strip():
            continue
        if len(columns) <= max(i1, i2, ig):
            raise PairforgeError(
                f"{path}:{number}: expected at least {max(i1, i2, ig) + 1} tab-separated columns"
            )
        if not columns[ig].strip():
            continue
        s1.append(columns[i1])
        s2.append(columns[i2])
        gold.append(_score(columns[ig], f"{path}:{number}"))
    return STSData(task, s1, s2, np.array(gold), np.zeros(len(s1), dtype=int), (task,))


def subsample(data: STSData, max_pairs: int | None, seed: int = 0) -> STSData:
    """At most ``max_pairs`` pairs drawn without replacement (seeded), kept in file order."""
    if not max_pairs or len(data) <= max_pairs:
        return data
    index = np.sort(
        np.random.default_rng([seed, len(data)]).choice(len(data), max_pairs, replace=False)
    )
    return data.take(index)


def rankdata(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank (scipy's ``rankdata(method="average")``)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # Start of each run of equal values, and each element's run.
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    average = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson over average ranks); NaN when either is constant."""
    return pearson(rankdata(x), rankdata(y))


def normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of ``a[i]`` and ``b[i]`` for every row, ``(n, d), (n, d) -> (n,)``."""
    return (normalize(a) * normalize(b)).sum(axis=1)


def alignment(a: np.ndarray, b: np.ndarray, alpha: float = 2.0) -> float:
    """``E ||f(x) - f(y)||^alpha`` over positive pairs (rows of ``a`` and ``b``), normalised vectors."""
    return float((np.linalg.norm(normalize(a) - normalize(b), axis=1) ** alpha).mean())


def uniformity(vectors: np.ndarray, t: float = 2.0) -> float:
    """``log E exp(-t ||f(x) - f(y)||^2)`` over all pairs of distinct rows, normalised vectors."""
    z = normalize(vectors)
    squared = np.maximum(2.0 - 2.0 * (z @ z.T), 0.0)  # ||a - b||^2 of unit vectors
    upper = squared[np.triu_indices(len(z), k=1)]
    return float(np.log(np.mean(np.exp(-t * upper))))


def score_task(data: STSData, cosines: np.ndarray) -> dict:
    """Spearman x100 of one task (the "all" value for STS12-16) and its per-subset breakdown."""
    result: dict = {"spearman": 100 * spearman(cosines, data.gold), "pairs": len(data)}
    if len(data.subsets) > 1:
        per_subset = {}
        for k, name in enumerate(data.subsets):
            mask = data.subset == k
            if mask.any():
                per_subset[name] = {
                    "spearman": 100 * spearman(cosines[mask], data.gold[mask]),
                    "pairs": int(mask.sum()),
                }
        values = np.array([v["spearman"] for v in per_subset.values()])
        weights = np.array([v["pairs"] for v in per_subset.values()])
        result.update(
            subsets=per_subset,
            mean=float(values.mean()),
            wmean=float((values * weights).sum() / weights.sum()),
        )
    return result


def evaluate(
    embed: Embed,
    root: str | Path,
    tasks: Sequence[str] = TEST_TASKS,
    max_pairs: int | None = None,
    seed: int = 0,
    align_uniform: bool = True,
    data: dict[str, STSData] | None = None,
    align_task: str = "stsb",
) -> dict:
    """Score ``embed`` (texts -> ``(n, d)`` vectors) on ``tasks``.

    Every distinct sentence is embedded once. ``max_pairs`` evaluates a seeded sample of each task
    (a quick check, not comparable with published figures). ``data`` passes tasks already loaded
    (whole: the sample is drawn here). Returns ``{"tasks": {task: score_task(...) with
    "pairs_total", the task's pairs before sampling}, "avg": mean Spearman over the tasks}`` plus,
    when ``align_uniform``, ``alignment`` and ``uniformity`` over ``align_task`` (STS-B test by
    default, loaded or loadable from ``root``) with ``align_task``, ``align_pairs`` (scored) and
    ``align_pairs_total`` (before sampling).
    """
    data = data or {}

    def whole(task: str) -> STSData:
        found = data.get(task)
        return found if found is not None else load_task(root, task)

    full = {task: whole(task) for task in tasks}
    loaded = {task: subsample(d, max_pairs, seed) for task, d in full.items()}
    stsb = None
    if align_uniform:
        if align_task not in full:
            full[align_task] = whole(align_task)
        stsb = loaded.get(align_task)
        if stsb is None:
            stsb = subsample(full[align_task], max_pairs, seed)
    scored = [*loaded.values(), *([stsb] if stsb is not None else [])]
    sentences = sorted({s for d in scored for s in (*d.s1, *d.s2)})
    vectors = np.asarray(embed(sentences), dtype=np.float64) if sentences else np.zeros((0, 1))
    where = {s: i for i, s in enumerate(sentences)}

    def lookup(texts: list[str]) -> np.ndarray:
        return vectors[[where[s] for s in texts]]

    results: dict = {"tasks": {}}
    for task, d in loaded.items():
        results["tasks"][task] = score_task(d, cosine_rows(lookup(d.s1), lookup(d.s2)))
        results["tasks"][task]["pairs_total"] = len(full[task])
    if results["tasks"]:
        results["avg"] = float(np.mean([r["spearman"] for r in results["tasks"].values()]))
    if stsb is not None:
        positive = stsb.gold > 4
        results["alignment"] = alignment(
            lookup([s for s, p in zip(stsb.s1, positive, strict=True) if p]),
            lookup([s for s, p in zip(stsb.s2, positive, strict=True) if p]),
        )
        unique = sorted(set(stsb.s1) | set(stsb.s2))
        results["uniformity"] = uniformity(lookup(unique))
        results["align_task"] = align_task
        results["align_pairs"] = len(stsb)
        results["align_pairs_total"] = len(full[align_task])
        results["alignment_pairs"] = int(positive.sum())
        results["uniformity_sentences"] = len(unique)
    results["sentences_embedded"] = len(sentences)
    return results
