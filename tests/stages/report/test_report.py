"""report: lexical overlap by hand, histograms, and the stage end to end on a tiny BERT."""

from __future__ import annotations

import numpy as np
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.stages.embed.stage import EmbedConfig
from pairforge.stages.embed.stage import run as embed
from pairforge.stages.mine.stage import MineConfig
from pairforge.stages.mine.stage import run as mine
from pairforge.stages.report.diagnostics import csv_text, histograms, lexical_overlap
from pairforge.stages.report.positives import measure, source_label
from pairforge.stages.report.stage import ReportConfig, read_nli, run
from pairforge.stages.sample.stage import SampleConfig
from pairforge.stages.sample.stage import run as sample

from tests.stages.mining_helpers import copy_project, read_json


def test_lexical_overlap_by_hand():
    got = lexical_overlap(
        ["The cat sat on the mat.", "A b c", "", "the the the dog"],
        ["the cat lay on a mat .", "x y z w", "", "the the cat"],
    )
    # shared {the, cat, on, mat} = 4 of 6 words; nothing shared; no words; "the" twice of 4.
    np.testing.assert_allclose(got, [4 / 6, 0.0, 0.0, 2 / 4])
    assert lexical_overlap(["Hello, world!"], ["hello world"])[0] == 1.0  # punctuation and case


def test_histograms_are_fractions_on_common_bins():
    series = {"mined_positive": np.array([0.0, 0.1, 0.95, 1.0]), "mined_negative": np.array([0.5])}
    centres, fr = histograms(series, 10, 0, 1)
    a = fr["mined_positive"]
    assert centres.shape == (10,) and centres[0] == pytest.approx(0.05)
    assert a.sum() == pytest.approx(1.0) and a[0] == 0.25 and a[-1] == 0.5
    lines = csv_text(centres, fr).splitlines()
    # Every series of SERIES is a column (the ones not measured are empty), as dvc.yaml declares.
    assert (
        lines[0]
        == "bin,mined_positive,mined_negative,simcse_positive,simcse_negative,nli_positive,nli_negative"
    )
    assert len(lines) == 11 and lines[1].endswith(",0.000000,,,,")


def _snli(folder):
    folder.mkdir()
    premises = ["A man plays a guitar on stage .", "Two dogs run in a green park ."] * 20
    hypos = ["A man plays music .", "Cats sleep on a sofa ."] * 20
    labels = ["entailment", "contradiction"] * 20
    for name, lines in (("s1", premises), ("s2", hypos), ("labels", labels)):
        (folder / f"{name}.dev").write_text("".join(f"{x} \n" for x in lines))
    return folder


@pytest.fixture(scope="module")
def pipeline_project(mining_inputs, tiny_bert, tmp_path_factory):
    root = copy_project(mining_inputs, tmp_path_factory.mktemp("report"))

    def p(x):
        return str(root / x)

    embed(
        EmbedConfig(
            model=str(tiny_bert),
            pooling="mean",
            max_length=32,
            device="cpu",
            sentences=p("data/sentences"),
            candidates=p("data/candidates"),
            output=p("data/embeddings/sentences"),
            candidates_output=p("data/embeddings/candidates"),
            rewrites=p("data/rewrites"),
            rewrites_output=p("data/embeddings/rewrites"),
            metrics=p("metrics/embed.json"),
        ),
        progress=False,
    )
    mine(
        MineConfig(
            sentences=p("data/sentences"),
            embeddings=p("data/embeddings/sentences"),
            candidates=p("data/candidates"),
            output=p("data/pools"),
            metrics=p("metrics/mine.json"),
            band_low=0.0,
            band_high=0.95,
            k=16,
        ),
        progress=False,
    )
    sample(
        SampleConfig(
            sentences=p("data/sentences"),
            pools=p("data/pools"),
            embeddings=p("data/embeddings/sentences"),
            candidates=p("data/candidates"),
            candidate_embeddings=p("data/embeddings/candidates"),
            rewrites=p("data/rewrites"),
            rewrite_embeddings=p("data/embeddings/rewrites"),
            output=p("data/pairs"),
            metrics=p("metrics/sample.json"),
        ),
        progress=False,
    )
    return root


def _cfg(root, **kw) -> ReportConfig:
    base = dict(
        pairs=str(root / "data/pairs"),
        sentences=str(root / "data/sentences"),
        embeddings=str(root / "data/embeddings/sentences"),
        candidates=str(root / "data/candidates"),
        reports=str(root / "reports"),
        plots=str(root / "plots"),
        metrics=str(root / "metrics/report.json"),
        device="cpu",
        simcse_pairs=50,
        random_pairs=300,
        bins=20,
    )
    return ReportConfig(**{**base, **kw})


def test_report_stage_with_nli(pipeline_project, tmp_path, monkeypatch):
    root = pipeline_project
    monkeypatch.setenv("SNLI_TEST_ROOT", str(tmp_path))
    _snli(tmp_path / "snli")
    metrics = run(_cfg(root, nli="$SNLI_TEST_ROOT/snli", nli_pairs=15))
    s = metrics["summary"]
    assert set(s) == {"mined", "simcse", "nli"}
    assert s["simcse"]["positive"]["overlap"]["mean"] == 1.0
    assert 0.5 < s["simcse"]["positive"]["cos"]["mean"] < 1.0  # two dropout masks: not identical
    assert s["nli"]["positive"]["overlap"]["n"] == 15 and metrics["nli"]["status"] == "used"
    # "A man plays a guitar on stage ." vs "A man plays music .": shared a, man, plays of 7 words.
    assert s["nli"]["positive"]["overlap"]["mean"] == pytest.approx(3 / 7, abs=1e-4)
    assert s["nli"]["negative"]["overlap"]["mean"] == pytest.approx(1 / 7, abs=1e-4)  # "a"
    assert s["mined"]["negative"]["overlap"]["n"] > 100
    md = (root / "reports/mining.md").read_text()
    assert "| supervised NLI (entailment / contradiction) | 0.43 | 0.14 |" in md
    assert "0.56 / 0.21" in md  # the paper's numbers beside ours
    for name in ("mining_overlap.png", "mining_cosine.png"):
        assert (root / "reports" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = (root / "plots/mining_cosine.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert header[0] == "bin" and "nli_positive" in header and "mined_negative" in header
    cols = np.array([[float(x) for x in line.split(",")] for line in lines[1:]])
    np.testing.assert_allclose(cols[:, 1:].sum(axis=0), 1.0, atol=1e-4)
    assert read_json(root / "metrics/report.json")["summary"] == s


def test_report_without_nli_and_bad_nli(pipeline_project, monkeypatch):
    root = pipeline_project
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    metrics = run(_cfg(root, nli="$NOT_SET_ANYWHERE/snli", simcse_pairs=0))
    assert "nli" not in metrics["summary"] and metrics["nli"]["status"].startswith("skipped")
    assert "NLI pairs: skipped" in (root / "reports/mining.md").read_text()
    with pytest.raises(ConfigError, match="is not a folder"):
        run(_cfg(root, nli=str(root / "nowhere")))


def test_read_nli_shared_data(shared_data):
    pairs = read_nli(shared_data / "nli/snli_senteval", "dev")
    assert len(pairs["entailment"][0]) == 3329 and len(pairs["contradiction"][0]) == 3278
    assert not pairs["entailment"][0][0].endswith(" ")


def test_report_shows_pairs_to_read(pipeline_project):
    root = pipeline_project
    run(_cfg(root, nli=None, simcse_pairs=0, read_anchors=4))
    md = (root / "reports/mining.md").read_text()
    section = md.split("## A sample of pairs to read", 1)[1]
    pairs = open_dataset(root / "data/pairs", S.PAIRS).read_table().to_pylist()
    by_text = {r[S.TEXT]: r for r in pairs}
    anchors = [line.split("** ", 1)[1] for line in section.splitlines() if line.startswith("**")]
    assert len(anchors) == 4 and len(set(anchors)) == 4
    for anchor in anchors:  # every sampled item of the anchor, with its own scores
        row = by_text[anchor]
        for side, mark in (("positive", "+"), ("negative", "-")):
            for j, text in enumerate(row[f"{side}_texts"]):
                p, c, e = (row[f"{side}_{x}"][j] for x in ("prob", "cos", "edit"))
                assert f"| {mark} | {text} | {p:.3f} | {c:.3f} | {e:.3f} |" in section
    run(_cfg(root, nli=None, simcse_pairs=0, read_anchors=0))
    assert "## A sample of pairs to read" not in (root / "reports/mining.md").read_text()


def test_report_measures_each_routes_positives_beside_another_dataset(pipeline_project):
    root = pipeline_project
    candidates = open_dataset(root / "data/candidates", S.CANDIDATES).read_table().to_pylist()
    clean = [r for r in candidates if r[S.NOISE] == "none"]
    routes = sorted({r[S.ROUTE] for r in clean})
    metrics = run(
        _cfg(
            root, nli=None, simcse_pairs=0, read_anchors=0, route_pairs=10 ** 6,
            compare_candidates=[str(root / "data/candidates")],
        )
    )  # fmt: skip
    table = metrics["positives_by_route"]
    label = source_label(str(root / "data/candidates"))
    assert list(table) == [f"{label} {r}" for r in routes] + [f"{label} {r}'" for r in routes]
    for route in routes:
        rows = [r for r in clean if r[S.ROUTE] == route]
        row = table[f"{label} {route}"]
        assert row["n"] == len(rows)
        assert row["identical"] == pytest.approx(np.mean([r[S.IDENTICAL] for r in rows]), abs=1e-4)
        edits = np.array([r[S.EDIT_RATIO] for r in rows], dtype=np.float64)
        assert row["edit"]["p50"] == pytest.approx(np.quantile(edits, 0.5), abs=1e-4)
        assert -1 <= row["cos"]["p10"] <= row["cos"]["p50"] <= row["cos"]["p90"] <= 1.0001
        assert table[f"{label} {route}'"] == row  # the same dataset measured twice alike
    md = (root / "reports/mining.md").read_text()
    assert "## Positive candidates by route" in md and f"| {label} {routes[0]} |" in md
    assert (root / "reports/positives_by_route.png").read_bytes()[:4] == b"\x89PNG"


def test_route_measures_by_hand(tmp_path):
    """An identical round trip has cosine 1 and edit 0; an orthogonal one cosine 0."""
    from tests.stages.augment_helpers import write_candidates

    path = write_candidates(
        tmp_path / "c",
        [("s1", "alpha", "alpha", "r1"), ("s2", "beta", "gamma", "r1"), ("s3", "delta", "x", "r2")],
    )
    basis = {"alpha": [1, 0, 0], "beta": [0, 1, 0], "gamma": [0, 0, 1], "delta": [1, 0, 0]}
    basis["x"] = [0.6, 0.8, 0]
    series = measure([str(path)], lambda t: np.array([basis[x] for x in t], np.float32), 5, 0)
    label = source_label(str(path))
    np.testing.assert_allclose(series[f"{label} r1"]["cos"], [1.0, 0.0])
    np.testing.assert_allclose(series[f"{label} r2"]["cos"], [0.6], atol=1e-6)
    assert series[f"{label} r1"]["identical"] == 0.5
