"""The mining benchmark's pure parts (benchmarks/mine_table.py, benchmarks/mine_corpus.py): the
medians, ratios and verdicts of its table, which stored peer figures a rerun reuses, and the
corpus and candidates both sides start from, on small real files. No process is timed here."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str, alias: str | None = None):
    """A benchmark module by file; ``alias`` keeps a generic name out of sys.modules."""
    spec = importlib.util.spec_from_file_location(alias or name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    path = list(sys.path)
    spec.loader.exec_module(module)
    sys.path[:] = path  # mine.py puts benchmarks/ first: its train.py must not shadow anything
    return module


table = load("mine_table")
corpus = load("mine_corpus")


def run(system: str, seconds: float, peak: float, variant: str = "", env: str = "defaults",
        n: int = 10_000, **extra) -> dict:  # fmt: skip
    return {"n": n, "system": system, "variant": variant, "env": env, "seconds": seconds,
            "peak_mib": peak, "load_before": [2.0, 2.0, 2.0], "load_after": [3.0, 2.0, 2.0],
            "key": extra.pop("key", f"{system}-{variant}-{env}"), **extra}  # fmt: skip


def stages(*seconds_and_peaks: tuple[float, float]) -> dict:
    return {
        s: {"seconds": t, "peak_mib": p}
        for s, (t, p) in zip(table.STAGES, seconds_and_peaks, strict=True)
    }


def test_spread_is_median_and_range():
    assert table.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "low": 1.0, "high": 3.0, "n": 3}
    assert table.spread([4.0, 1.0]) == {"median": 2.5, "low": 1.0, "high": 4.0, "n": 2}


def test_pairforge_total_sums_times_and_keeps_the_largest_peak():
    total = table.pairforge_total(stages((1.0, 150), (30.0, 700), (2.0, 200), (3.0, 300)))
    assert total == {"seconds": 36.0, "peak_mib": 700}


def test_compare_ratios_and_targets_per_peer_environment():
    ours = [run("pairforge", s, 400) for s in (40.0, 50.0, 60.0)]
    peer = [run("peer", s, 1000, "torch") for s in (100.0, 110.0, 90.0)]
    c = table.compare(ours, peer, "defaults")
    assert c["time"]["median"] == pytest.approx(50 / 100)
    assert c["time"]["low"] == pytest.approx(40 / 110)
    assert c["time"]["high"] == pytest.approx(60 / 90)
    assert c["time_target"] == 0.5 and c["time_met"]  # at the target counts as met
    assert c["memory"]["median"] == pytest.approx(0.4) and c["memory_met"]
    same = table.compare(ours, [run("peer", 60.0, 600, "torch", "pairforge")], "pairforge")
    assert same["time_target"] == 0.8 and not same["time_met"]  # 50 / 60 = 0.83
    assert not same["memory_met"]  # 400 / 600 = 0.67 > 0.6
    assert "NOT met" in table.verdict(same) and "0.83x" in table.verdict(same)


def test_markdown_lists_systems_stages_and_verdicts():
    runs = [
        run("pairforge", 36.0, 700, stages=stages((1, 150), (30, 700), (2, 200), (3, 300))),
        run("pairforge", 40.0, 710, stages=stages((1, 150), (34, 710), (2, 200), (3, 300))),
        run("peer", 100.0, 2000, "torch"),
        run("peer", 90.0, 1900, "torch", "pairforge", reused=True),
    ]
    text = table.markdown(runs)
    assert (
        "| 10,000 | pairforge `ingest` + `embed` + `mine` + `sample` | 2 | 38.0 (36.0-40.0) |"
        in text
    )
    assert "| 10,000 | `embed` | 32.0 (30.0-34.0) | 705 (700-710) |" in text
    assert "(stored) | 1 | 90.0 |" in text  # one repeat: no range; a reused figure is marked
    assert "| 2.0-3.0 |" in text  # the 1-minute load seen around the runs
    lines = [x for x in text.splitlines() if x.startswith("- 10,000")]
    assert len(lines) == 2
    assert "time 0.38x" in lines[0] and "<= 0.5x: met" in lines[0]
    assert "time 0.42x" in lines[1] and "<= 0.8x: met" in lines[1]
    assert "peak memory 0.35x" in lines[0]


def test_reusable_keeps_stored_peer_figures_above_the_threshold_only():
    stored = [run("peer", 900.0, 7000, "torch", key="a", n=100_000),
              run("pairforge", 300.0, 900, key="a", n=100_000),
              run("peer", 950.0, 7100, "torch", key="b", n=100_000)]  # fmt: skip
    assert table.reusable(stored, "a", 100_000, 10_000) == [stored[0]]
    assert table.reusable(stored, "c", 100_000, 10_000) == []  # other settings: measure again
    assert table.reusable(stored, "a", 10_000, 10_000) == []  # at or below: every repeat runs
    assert table.reusable(stored, "a", 100_000, None) == []


@pytest.fixture
def shared(tmp_path, monkeypatch) -> Path:
    """A small data folder laid out as ../shared/data: Wikipedia lines (the last one cut off)
    and SNLI sentence files."""
    root = tmp_path / "shared"
    wiki = root / corpus.WIKI
    wiki.parent.mkdir(parents=True)
    lines = [f"wiki sentence number {i} with  some words" for i in range(40)]
    wiki.write_text("\n".join([*lines, "Too short", "a cut off li"]))
    snli = root / corpus.SNLI
    snli.mkdir(parents=True)
    for split in ("dev", "test"):
        for side in ("s1", "s2"):
            (snli / f"{side}.{split}").write_text(
                f"A man walks his dog {split} {side}.\nA man walks his dog dev s1.\nTwo words\n"
            )
    monkeypatch.setenv("PAIRFORGE_SHARED_DATA", str(root))
    return root


def test_real_sentences_are_normalised_unique_and_long_enough(shared):
    real = corpus.real_sentences()
    assert real[0] == "wiki sentence number 0 with some words"  # whitespace normalised
    assert "a cut off li" not in real  # the file's last line is cut off
    assert "Too short" not in real and "Two words" not in real  # under 3 words
    assert len(real) == 40 + 4  # the SNLI repeat kept once
    assert len(set(real)) == len(real)


def test_build_corpus_is_seeded_and_copies_differ_by_one_edit(shared):
    texts, origin = corpus.build_corpus(200, seed=3)
    assert (texts, origin) == corpus.build_corpus(200, seed=3)
    assert texts != corpus.build_corpus(200, seed=4)[0]
    assert len(texts) == len(set(texts)) == 200
    real = set(corpus.real_sentences())
    assert {t for t, o in zip(texts, origin, strict=True) if o is None} == real
    for t, o in zip(texts, origin, strict=True):
        if o is not None:
            assert o in real and t != o
            assert abs(len(t.split()) - len(o.split())) <= 1


def test_perturb_edits_one_word():
    rng = random.Random(0)
    for _ in range(50):
        out = corpus.perturb("one two three four five", rng).split()
        assert out != ["one", "two", "three", "four", "five"]
        assert len(out) in (4, 5, 6)


def test_candidates_are_the_copies_of_present_sentences(shared, tmp_path):
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset
    from pairforge.pipeline.science.text import sentence_id

    texts, origin = corpus.build_corpus(120, seed=0)
    texts, origin = texts[:60], origin[:60]
    pairs = corpus.candidate_pairs(texts, origin)
    assert pairs and all(texts[a] == origin[c] for a, c in pairs)
    absent = [i for i, o in enumerate(origin) if o is not None and o not in texts]
    assert absent and not {c for _, c in pairs} & set(absent)
    assert corpus.write_candidates(tmp_path / "candidates", texts, origin) == len(pairs)
    got = open_dataset(tmp_path / "candidates", S.CANDIDATES).read_table()
    assert got[S.ID].to_pylist() == [sentence_id(texts[a]) for a, _ in pairs]
    assert got[S.TEXT].to_pylist() == [texts[c] for _, c in pairs]
    assert len(set(got[S.CANDIDATE_ID].to_pylist())) == len(pairs)
    corpus.write_corpus(tmp_path / "corpus.txt", texts)
    assert (tmp_path / "corpus.txt").read_text().splitlines() == texts


def test_peer_key_ignores_pairforge_only_settings(shared):
    import argparse

    mine = load("mine", "mine_benchmark")
    args = argparse.Namespace(batch_size=64, max_length=128, rows_per_shard=10_000,
                              pool_cap=None, no_candidates=False)  # fmt: skip
    texts = ["a b c", "d e f"]
    base = mine.settings_of(args, 2, texts)
    other = mine.settings_of(argparse.Namespace(**{**vars(args), "pool_cap": 1024}), 2, texts)
    assert mine.key_of(base, "peer", "torch", "defaults") == mine.key_of(
        other, "peer", "torch", "defaults"
    )
    assert mine.key_of(base, "pairforge", "", "defaults") != mine.key_of(
        other, "pairforge", "", "defaults"
    )
    wider = mine.settings_of(argparse.Namespace(**{**vars(args), "max_length": 256}), 2, texts)
    assert mine.key_of(base, "peer", "torch", "defaults") != mine.key_of(
        wider, "peer", "torch", "defaults"
    )
    assert mine.key_of(base, "peer", "torch", "defaults") != mine.key_of(
        base, "peer", "torch", "pairforge"
    )
    assert mine.key_of(base, "peer", "torch", "defaults") != mine.key_of(
        mine.settings_of(args, 2, ["a b c", "d e g"]), "peer", "torch", "defaults"
    )


def test_a_stored_peer_figure_from_another_cpu_is_not_reused(shared, monkeypatch):
    """The encoder's speed depends on the CPU's vector instructions (int8 and float32 kernels
    differ between AVX2 and AVX-512 machines): the peer's key names the CPU."""
    import argparse

    mine = load("mine", "mine_benchmark")
    args = argparse.Namespace(batch_size=64, max_length=128, rows_per_shard=10_000,
                              pool_cap=None, no_candidates=False)  # fmt: skip
    here = mine.settings_of(args, 2, ["a b c", "d e f"])
    assert here["cpu"] == mine.cpu_model() and here["cpu"]
    other = "Intel Xeon avx2" if "avx512" in here["cpu"] else "AMD EPYC avx2 avx512f avx512_vnni"
    monkeypatch.setattr(mine, "cpu_model", lambda: other)
    there = mine.settings_of(args, 2, ["a b c", "d e f"])
    assert mine.key_of(here, "peer", "torch", "defaults") != mine.key_of(
        there, "peer", "torch", "defaults"
    )
