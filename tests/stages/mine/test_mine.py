"""mine: pools against a brute-force numpy reference, exclusions, fallbacks, index kinds, bad input."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import DataIntegrityError
from pairforge.pipeline.plumbing.schemas import SchemaError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.text import sentence_id
from pairforge.stages.mine.stage import MineConfig, run

from tests.stages.mine.helpers import mine_cfg, sentence_ids, vectors
from tests.stages.mining_helpers import (
    candidate_rows,
    make_texts,
    read_json,
    unit,
    write_candidates,
    write_embeddings,
    write_sentences,
)


@pytest.mark.parametrize("pool_cap", [None, 239])
def test_pools_equal_a_brute_force_numpy_reference(project, pool_cap):
    """pool_cap None: the band within the k nearest; 239 (the whole corpus): all of the band."""
    k, low, high = 20, 0.2, 0.6
    metrics = run(
        mine_cfg(
            project,
            k=k,
            pool_cap=pool_cap,
            band_low=low,
            band_high=high,
            near_duplicate_threshold=None,
            fallback="none",
            candidates=None,
        ),
        progress=False,
    )
    assert metrics["index"]["kind"] == "flat" and metrics["index"]["recall_at_k"] == 1.0
    pools = open_dataset(project / "data/pools", S.POOLS)
    assert len(pools) == 6 and pools.num_rows == 240
    table = pools.read_table()
    v = vectors(240).astype(np.float64)
    sims = v @ v.T  # (240, 240)
    ids = np.array(sentence_ids(project))
    for a in range(240):
        order = np.argsort(-sims[a], kind="stable")
        order = order[order != a][: k if pool_cap is None else None]
        want = [j for j in order if low <= sims[a, j] <= high]
        row = table.slice(a, 1).to_pylist()[0]
        assert row[S.ROW] == a and row[S.ID] == ids[a]
        assert row[S.POOL_ROWS] == want, f"anchor {a}"
        assert row[S.POOL_IDS] == ids[want].tolist()
        np.testing.assert_allclose(row[S.POOL_COS], sims[a, want], atol=1e-5)
        assert row[S.SHORT] == (len(want) < 2) and row[S.FALLBACK] == "none"
    sizes = [len(r) for r in table[S.POOL_ROWS].to_pylist()]
    assert metrics["candidates_in_pools"] == sum(sizes)
    assert metrics["excluded"]["self"] == 240
    if pool_cap is None:
        assert metrics["excluded"]["below_band"] + metrics["excluded"]["above_band"] == (
            240 * k - sum(sizes)
        )
        cov = metrics["band_coverage"]  # k = 20 reaches only part of these bands
        assert cov["capped_share"] > 0.5 and cov["coverage"] < 0.5
        assert cov["mean_band_size"] > 2 * cov["mean_band_reached"]
    else:  # the whole band reached: no anchor capped, coverage exact on the sample
        cov = metrics["band_coverage"]
        assert cov["capped"] == 0 and cov["coverage"] == 1.0 and cov["pool_over_band"] == 1.0
        assert metrics["excluded"]["missing"] == 0


def test_self_duplicates_and_own_augmentations_never_enter(tmp_path):
    base = "The old river bank was quiet after the storm in winter ."
    texts = [
        base,
        "The old river bank was quiet after the rain in winter .",  # near duplicate (one word)
        "the  OLD river bank was quiet after the storm in winter .",  # same text, normalised
        "After the storm the river was quiet .",  # one of row 0's augmentations
        "A farmer sold the red harvest near the village market .",  # a real hard negative
        *make_texts(40, seed=9),
    ]
    write_sentences(tmp_path / "data/sentences", texts, rows_per_shard=50)
    ids = [sentence_id(t) for t in texts]
    aug = candidate_rows(ids[:1], texts[:1])
    aug[0][S.TEXT] = texts[3]
    write_candidates(tmp_path / "data/candidates", aug, rows_per_shard=10)
    d = 64
    v = np.zeros((len(texts), d), dtype=np.float32)
    v[0, 0] = 1.0
    for i in range(1, 5):  # rows 1-4 all at cosine 0.5 to the anchor: inside the band
        v[i, 0], v[i, i] = 0.5, np.sqrt(0.75)
    rng = np.random.default_rng(0)
    v[5:, 8:] = rng.standard_normal((len(texts) - 5, d - 8))
    write_embeddings(tmp_path / "data/embeddings/sentences", ids, unit(v + 0.0), [len(texts)])
    metrics = run(mine_cfg(tmp_path, k=10, fallback="none"), progress=False)
    row0 = open_dataset(tmp_path / "data/pools", S.POOLS).read_table().slice(0, 1).to_pylist()[0]
    assert row0[S.POOL_ROWS] == [4]
    ex = metrics["excluded"]
    assert ex["near_duplicate"] >= 1 and ex["exact_duplicate"] >= 1 and ex["own_augmentation"] >= 1
    assert metrics["augmentations"] == {"status": "used", "rows": 4, "orphans": 0}


def _rewrite_project(root) -> list[str]:
    """Anchor 0, a back-translation of it (row 3) and an LLM rewrite of it (row 4) that are both
    also corpus sentences, a real hard negative (row 5): rows 1-5 sit at cosine 0.5 to the anchor,
    inside the band, and neither augmentation is a near duplicate of it."""
    texts = [
        "The old river bank was quiet after the storm in winter .",
        "The old river bank was quiet after the rain in winter .",  # near duplicate (one word)
        "the  OLD river bank was quiet after the storm in winter .",  # same text, normalised
        "After the storm the river was quiet .",  # row 0's back-translation
        "In winter, once the storm had passed, the riverbank fell silent .",  # row 0's rewrite
        "A farmer sold the red harvest near the village market .",  # a real hard negative
        *make_texts(40, seed=9),
    ]
    write_sentences(root / "data/sentences", texts, rows_per_shard=50)
    ids = [sentence_id(t) for t in texts]
    aug = candidate_rows(ids[:1], texts[:1])
    aug[0][S.TEXT] = texts[3]
    write_candidates(root / "data/candidates", aug, rows_per_shard=10)
    rewrite = candidate_rows(ids[:1], texts[:1], seed=1)[:1]
    rewrite[0].update({S.TEXT: texts[4], S.ROUTE: "llm", S.CANDIDATE_ID: "rewrite-0"})
    write_candidates(root / "data/rewrites", rewrite, rows_per_shard=10)
    d = 64
    v = np.zeros((len(texts), d), dtype=np.float32)
    v[0, 0] = 1.0
    for i in range(1, 6):  # cosine 0.5 to the anchor
        v[i, 0], v[i, i] = 0.5, np.sqrt(0.75)
    rng = np.random.default_rng(0)
    v[6:, 8:] = rng.standard_normal((len(texts) - 6, d - 8))
    write_embeddings(root / "data/embeddings/sentences", ids, unit(v + 0.0), [len(texts)])
    return texts


def test_llm_rewrites_are_own_augmentations_too(tmp_path):
    _rewrite_project(tmp_path)
    metrics = run(mine_cfg(tmp_path, k=10, fallback="none"), progress=False)
    row0 = open_dataset(tmp_path / "data/pools", S.POOLS).read_table().slice(0, 1).to_pylist()[0]
    assert row0[S.POOL_ROWS] == [5]  # neither the back-translation (3) nor the rewrite (4)
    assert metrics["excluded"]["own_augmentation"] == 2
    assert metrics["augmentations"] == {"status": "used", "rows": 4, "orphans": 0}
    assert metrics["rewrites"] == {"status": "used", "rows": 1, "orphans": 0}
    fp = open_dataset(tmp_path / "data/pools", S.POOLS).manifest["fingerprint"]

    # The same corpus with the rewrites ignored: the rewrite is a negative like any neighbour.
    off = mine_cfg(tmp_path, k=10, fallback="none", rewrites=None, output=str(tmp_path / "off"))
    metrics = run(off, progress=False)
    row0 = open_dataset(tmp_path / "off", S.POOLS).read_table().slice(0, 1).to_pylist()[0]
    assert sorted(row0[S.POOL_ROWS]) == [4, 5]  # equal cosines: either order
    assert metrics["excluded"]["own_augmentation"] == 1
    assert metrics["rewrites"] == {"status": "disabled", "rows": 0}
    assert open_dataset(tmp_path / "off", S.POOLS).manifest["fingerprint"] != fp


def test_empty_or_absent_rewrites_change_nothing(project, tmp_path):
    from pairforge.stages.rewrite.stage import RewriteConfig
    from pairforge.stages.rewrite.stage import run as rewrite

    shards = {}
    for case in ("absent", "empty", "disabled"):
        if case == "empty":  # the demo's: rewrite disabled writes an empty, complete dataset
            rewrite(
                RewriteConfig(
                    enabled=False,
                    output=str(project / "data/rewrites"),
                    quarantine=str(project / "data/quarantine/rewrite"),
                    metrics=str(project / "metrics/rewrite.json"),
                ),
                None,
            )
        out = tmp_path / case
        cfg = mine_cfg(project, k=16, output=str(out), metrics=str(tmp_path / f"{case}.json"))
        cfg = cfg.model_copy(update={"rewrites": None}) if case == "disabled" else cfg
        metrics = run(cfg, progress=False)
        assert metrics["rewrites"]["status"] == case and metrics["rewrites"]["rows"] == 0
        manifest = open_dataset(out, S.POOLS).manifest
        files = [out / s["file"] for s in manifest["shards"]]
        shards[case] = (manifest["fingerprint"], [f.read_bytes() for f in files])
    assert shards["empty"] == shards["absent"] == shards["disabled"]


def test_rewrites_of_another_schema_are_a_clear_error(project):
    shutil.copytree(project / "data/sentences", project / "data/rewrites")  # a sentences dataset
    with pytest.raises(SchemaError, match="data/rewrites.*expected schema candidates"):
        run(mine_cfg(project), progress=False)


@pytest.mark.parametrize("fallback", ["random", "widen"])
def test_short_pools_get_the_fallback_and_it_is_recorded(project, fallback):
    metrics = run(
        mine_cfg(
            project,
            k=8,
            band_low=0.55,
            band_high=0.6,
            min_pool=3,
            fallback=fallback,
            widen_limits=(0.0, 0.9),
        ),
        progress=False,
    )
    table = open_dataset(project / "data/pools", S.POOLS).read_table().to_pylist()
    touched = [r for r in table if r[S.FALLBACK] == fallback]
    assert touched and metrics["short_before_fallback"] == len(touched)
    assert metrics["fallback_used"][fallback] == len(touched)
    for r in touched:
        assert r[S.WAS_SHORT]
        assert all(c <= r[S.BAND_HIGH] + 1e-6 for c in r[S.POOL_COS])
        if fallback == "random":
            assert any(r[S.POOL_RANDOM]) or r[S.SHORT]
            assert r[S.BAND_LOW] == pytest.approx(0.55)
        else:
            assert not any(r[S.POOL_RANDOM])
            assert r[S.BAND_LOW] < 0.55 or r[S.BAND_HIGH] > 0.6
    assert all(r[S.FALLBACK] == "none" and not r[S.WAS_SHORT] for r in table if r not in touched)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_index_reports_its_recall(project, kind):
    metrics = run(
        mine_cfg(project, index=kind, nlist=4, nprobe=2, recall_sample=100, k=10), progress=False
    )
    index = metrics["index"]
    assert index["kind"] == kind and 0.5 < index["recall_at_k"] <= 1.0
    assert index["recall_k"] == 10 and index["recall_sample"] == 100
    if kind == "ivf":
        assert index["nlist"] == 4 and index["nprobe"] == 2
        assert (project / "data/pools/_work/index.faiss").exists() is False  # finalized: cleaned
    saved = read_json(project / "metrics/mine.json")
    assert saved["index"]["recall_at_k"] == index["recall_at_k"]


@pytest.mark.parametrize("codec", ["sq8", "sq4"])
def test_scalar_quantized_index_pools_carry_exact_cosines(project, codec):
    metrics = run(
        mine_cfg(project, index="ivf", ivf_codec=codec, nlist=8, nprobe=8, k=12), progress=False
    )
    assert metrics["index"]["codec"] == codec
    assert metrics["index"]["recall_at_k"] > {"sq8": 0.95, "sq4": 0.9}[codec]
    table = open_dataset(project / "data/pools", S.POOLS).read_table().to_pylist()
    v = vectors(240).astype(np.float64)
    for row in table:
        want = v[row[S.POOL_ROWS]] @ v[row[S.ROW]]
        np.testing.assert_allclose(row[S.POOL_COS], want, atol=1e-5)  # rescored, not 8-bit
        knn = [c for c, r in zip(row[S.POOL_COS], row[S.POOL_RANDOM], strict=True) if not r]
        assert knn == sorted(knn, reverse=True)  # neighbours by exact cosine; random fills last


def test_auto_switches_to_ivf_above_flat_max(project):
    metrics = run(mine_cfg(project, flat_max=100, recall_sample=50), progress=False)
    assert metrics["index"]["kind"] == "ivf" and "recall_at_k" in metrics["index"]


def test_nan_embeddings_are_a_clear_error(project):
    ids = sentence_ids(project)
    v = vectors(len(ids))
    v[77, 3] = np.nan
    write_embeddings(project / "data/embeddings/sentences", ids, v, [240])
    with pytest.raises(DataIntegrityError, match=f"first: id '{ids[77]}', NaN"):
        run(mine_cfg(project), progress=False)


def test_embeddings_of_other_sentences_are_a_clear_error(project):
    ids = sentence_ids(project)
    ids[5], ids[6] = ids[6], ids[5]
    write_embeddings(project / "data/embeddings/sentences", ids, vectors(240), [240])
    with pytest.raises(DataIntegrityError, match="row 5 has id .* stale, run embed again"):
        run(mine_cfg(project), progress=False)


def test_pools_table_reads_back_with_the_schema(project):
    run(mine_cfg(project, k=12), progress=False)
    table = open_dataset(project / "data/pools", S.POOLS).read_shard(0)
    assert table.schema.field(S.POOL_COS).type == pa.list_(pa.float32())


def test_anchor_batches_do_not_change_the_pools(project, tmp_path):
    run(mine_cfg(project, k=16, min_pool=4), progress=False)
    whole = open_dataset(project / "data/pools", S.POOLS)
    other = mine_cfg(project, k=16, min_pool=4, anchor_batch=7, output=str(tmp_path / "pools"))
    run(other, progress=False)
    batched = open_dataset(tmp_path / "pools", S.POOLS)
    assert batched.read_table().equals(whole.read_table())
    assert (
        batched.manifest["fingerprint"] == whole.manifest["fingerprint"]
    )  # not a param of the result


def test_pool_cap_beyond_faiss_gpu_k_is_a_clear_error(project, monkeypatch):
    import pairforge.stages.mine.searcher as searcher_module
    from pairforge.pipeline.plumbing.errors import ConfigError

    real = searcher_module.open_index

    def on_gpu(*args, **kwargs):  # the index as faiss-gpu would report it
        index, facts = real(*args, **kwargs)
        return index, {**facts, "gpu": True}

    monkeypatch.setattr(searcher_module, "open_index", on_gpu)  # mine imports it when it runs
    with pytest.raises(ConfigError, match=r"mine.pool_cap: 4096 needs 4097 neighbours"):
        run(mine_cfg(project, pool_cap=4096), progress=False)
    assert run(mine_cfg(project, pool_cap=2047), progress=False)["pool_cap"] == 2047


def test_the_configs_ivf_codecs_are_the_index_builders():
    """``mine.ivf_codec`` is declared in the config (which imports no faiss) and in the index
    builder: the same codecs, each scalar one with its faiss quantizer."""
    from typing import get_args

    from pairforge.stages.mine import index as index_module

    declared = get_args(MineConfig.model_fields["ivf_codec"].annotation)
    assert declared == index_module.IVF_CODECS
    assert set(index_module.SQ_TYPES) == set(declared) - {"flat"}
