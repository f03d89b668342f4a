"""The million-sentence benchmark (benchmarks/million.py) end to end at a few hundred sentences:
its replicated vectors, the embeddings dataset it writes beside what ``ingest`` wrote (``mine``
refuses misaligned ids), the two timed processes and the table's ratios. MiniLM is not loaded
here: the base vectors are random unit vectors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.benchmarks.test_mine import load

million = load("million", "million_benchmark")


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_copies_sit_near_their_origin_and_apart_from_each_other():
    base = _unit(np.random.default_rng(1).standard_normal((3, 384)))
    texts = ["a b c", "d e f", "g h i"] + [f"copy {i}" for i in range(400)]
    origin = [None] * 3 + ["a b c"] * 400
    real = {"a b c": 0, "d e f": 1, "g h i": 2}
    v = million.corpus_vectors(texts, origin, real, base, noise=0.75)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(v[:3], base)  # the real sentences keep their vectors
    to_origin = v[3:] @ base[0]
    between = (v[3:203] * v[203:403]).sum(axis=1)
    # 1 / sqrt(1 + 0.75^2) = 0.80 and 1 / (1 + 0.75^2) = 0.64, as the docstring says.
    assert to_origin.mean() == pytest.approx(0.80, abs=0.02)
    assert between.mean() == pytest.approx(0.64, abs=0.03)
    assert to_origin.std() > 0.005  # seeded noise, not one shift for every copy


@pytest.mark.slow
def test_a_small_run_mines_samples_and_reports_ratios(tmp_path):
    texts, origin = million.build_corpus(600)
    real_texts = million.real_sentences()
    real = {t: i for i, t in enumerate(real_texts)}
    base = _unit(np.random.default_rng(0).standard_normal((len(real_texts), 32)))
    base[:, 0] += 2.0  # a shared direction: cosines spread over the band, not all near 0
    base = _unit(base)
    args = SimpleNamespace(
        work=str(tmp_path), rows_per_shard=250, noise=0.75, keep=True, nprobe=4, pool_cap=0,
        ivf_codec="sq4",
    )  # fmt: skip
    runs = [million.run_size(args, texts[:n], origin[:n], base, real) for n in (300, 600)]
    for r in runs:
        assert set(r["steps"]) == {"mine", "sample"}
        for step in r["steps"].values():
            assert step["seconds"] > 0 and step["peak_mib"] > 50
            # The sampled anonymous peak: part of the peak, and most of it (no big mapped file).
            assert 0.3 * step["peak_mib"] < step["anon_mib"] <= step["peak_mib"]
            # The load averages (1, 5, 15 min) before and after, printed beside the time.
            assert [len(x.split()) for x in step["load"]] == [3, 3]
        assert r["mine"]["index"]["kind"] == "ivf" and r["mine"]["index"]["nprobe"] == 4
        assert r["mine"]["index"]["codec"] == "sq4"  # --ivf-codec reached the stage
        assert r["mine"]["pool_size"]["max"] <= 64  # pool_cap 0: k only, no deepening
        assert 0 < r["mine"]["index"]["recall_at_k"] <= 1
        assert r["sample"]["anchors"] == r["n"]
    folder = tmp_path / "n600"
    # The vectors went with their own sentence ids, shard by shard. (Ingest keeps the input
    # order here, so this checks shard offsets and alignment, not the reordering itself.)
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import open_dataset
    from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings

    sentences = open_dataset(folder / "data/sentences", S.SENTENCES)
    assert len(sentences) == 3
    stored = sentences.read_table([S.ID, S.TEXT])
    vectors = load_vectors(open_embeddings(folder / "data/embeddings/sentences"), stored[S.ID])
    want = million.corpus_vectors(texts[:600], origin[:600], real, base, 0.75)
    row_of = {t: i for i, t in enumerate(texts[:600])}
    rows = [row_of[t] for t in stored[S.TEXT].to_pylist()]
    np.testing.assert_allclose(vectors, want[rows], atol=1e-6)
    out = million.table(runs)
    ratio = runs[1]["steps"]["mine"]["peak_mib"] / runs[0]["steps"]["mine"]["peak_mib"]
    assert f"{ratio:.2f}x the peak memory" in out and "| 600 | sample |" in out
    assert json.loads(json.dumps(runs)) == runs  # what million.json keeps
