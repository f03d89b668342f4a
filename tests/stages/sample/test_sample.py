"""sample: eqs. 1-6 recomputed independently from the pools, draws, positives and routes, policies,
bad inputs, the four readers, the card and the export."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pyarrow as pa
import pytest
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import (
    DataIntegrityError,
    IncompleteDatasetError,
    PairforgeError,
)
from pairforge.pipeline.plumbing.schemas import SchemaError
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.dataset_card import CARD
from pairforge.pipeline.science.mining_inputs import load_vectors, open_embeddings
from pairforge.pipeline.science.text import match_key
from pairforge.stages.mine.stage import MineConfig
from pairforge.stages.mine.stage import run as mine
from pairforge.stages.sample.pairs import draw, score_pools
from pairforge.stages.sample.stage import SampleConfig, run
from rapidfuzz.distance import Levenshtein
from scipy.stats import chisquare

from tests.stages.mining_helpers import (
    copy_project,
    read_json,
    unit,
    write_anchor_embeddings,
    write_candidates,
    write_embeddings,
)
from tests.stages.sample.edit_oracle import tokenize_words

INFO = {"model": "test", "pooling": "mean", "prompt": None, "max_length": 32, "dim": 16}


def _paths(root) -> dict:
    return dict(
        sentences=str(root / "data/sentences"),
        pools=str(root / "data/pools"),
        embeddings=str(root / "data/embeddings/sentences"),
        candidates=str(root / "data/candidates"),
        candidate_embeddings=str(root / "data/embeddings/candidates"),
        rewrites=str(root / "data/rewrites"),
        rewrite_embeddings=str(root / "data/embeddings/rewrites"),
        output=str(root / "data/pairs"),
        metrics=str(root / "metrics/sample.json"),
    )


def _cfg(root, **kw) -> SampleConfig:
    """The paper's equations as printed unless a test says otherwise: eqs. 1-6 by hand below."""
    return SampleConfig(**{**_paths(root), "ipw": "paper", "temperature": 1.0, **kw})


@pytest.fixture(scope="module")
def mined(mining_inputs, tmp_path_factory):
    """Sentences, candidates, synthetic embeddings (candidates near their anchor) and pools."""
    root = copy_project(mining_inputs, tmp_path_factory.mktemp("sample"))
    write_anchor_embeddings(root, clusters=6, shard_rows=[40] * 6, info=INFO)
    mine(
        MineConfig(
            sentences=_paths(root)["sentences"],
            embeddings=_paths(root)["embeddings"],
            candidates=_paths(root)["candidates"],
            output=_paths(root)["pools"],
            metrics=str(root / "metrics/mine.json"),
            k=24,
            band_low=0.1,
            band_high=0.8,
        ),
        progress=False,
    )
    return root


@pytest.fixture(scope="module")
def sampled(mined, tmp_path_factory):
    root = copy_project(mined, tmp_path_factory.mktemp("sampled"))
    # The paper's equations as printed: the tests below recompute eqs. 1-6 by hand.
    cfg = _cfg(
        root, corpus_name="test corpus", corpus_license="CC0-1.0", ipw="paper", temperature=1.0
    )
    metrics = run(cfg, progress=False)
    return root, metrics


def _distinct(candidates: list[dict]) -> list[dict]:
    """The first candidate of each normalised text, in order: the positive pool sample draws from."""
    seen: set[str] = set()
    out = []
    for c in candidates:
        key = match_key(c[S.TEXT])
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _hand_softmax(x: list[float]) -> np.ndarray:
    e = np.array([math.exp(v) for v in x])
    return e / e.sum()


def test_scores_follow_eqs_1_to_6_recomputed_from_the_pools(sampled):
    root, _ = sampled
    pairs = open_dataset(root / "data/pairs", S.PAIRS).read_table().to_pylist()
    pools = open_dataset(root / "data/pools", S.POOLS).read_table().to_pylist()
    texts = open_dataset(root / "data/sentences", S.SENTENCES).read_table()[S.TEXT].to_pylist()
    checked = 0
    for row, pool in zip(pairs[:60], pools[:60], strict=True):
        if not pool[S.POOL_ROWS]:
            continue
        anchor = tokenize_words(row[S.TEXT])
        edit = [
            Levenshtein.normalized_distance(anchor, tokenize_words(texts[j]))
            for j in pool[S.POOL_ROWS]
        ]
        cos = pool[S.POOL_COS]
        s_sur = 1 - _hand_softmax(edit)  # eq. 1
        s_sem = _hand_softmax(cos)  # eq. 2
        p_neg = _hand_softmax(list(0.2 * s_sur + 0.8 * (1 - s_sem)))  # eqs. 3-4
        pos_of = {rid: k for k, rid in enumerate(pool[S.POOL_IDS])}
        for j, nid in enumerate(row[S.NEGATIVE_IDS]):
            k = pos_of[nid]
            assert row["negative_edit"][j] == pytest.approx(edit[k], abs=1e-6)
            assert row["negative_cos"][j] == pytest.approx(cos[k], abs=1e-6)
            assert row["negative_s_sur"][j] == pytest.approx(s_sur[k], abs=1e-6)
            assert row["negative_s_sem"][j] == pytest.approx(s_sem[k], abs=1e-6)
            assert row["negative_prob"][j] == pytest.approx(p_neg[k], abs=1e-6)
            checked += 1
        assert row["negative_pool_size"] == len(edit)
        h = -(p_neg * np.log(p_neg)).sum() / math.log(len(p_neg)) if len(p_neg) > 1 else 1.0
        assert row["negative_entropy"] == pytest.approx(h, abs=1e-5)
        assert len(set(row[S.NEGATIVE_IDS])) == len(row[S.NEGATIVE_IDS]) == min(2, len(edit))
    assert checked > 50


def test_positives_eqs_5_6_identical_skipped_and_routes(sampled):
    root, metrics = sampled
    pairs = open_dataset(root / "data/pairs", S.PAIRS).read_table().to_pylist()
    cands = open_dataset(root / "data/candidates", S.CANDIDATES).read_table().to_pylist()
    by_anchor: dict[str, list[dict]] = {}
    for c in cands:
        by_anchor.setdefault(c[S.ID], []).append(c)
    identical_total = repeated_total = 0
    for row in pairs:
        own = by_anchor[row[S.ID]]
        kept = [c for c in own if not c[S.IDENTICAL]]
        usable = _distinct(kept)
        identical_total += len(own) - len(kept)
        repeated_total += len(kept) - len(usable)
        assert row[S.IDENTICAL_SKIPPED] == len(own) - len(kept)
        assert row["positive_pool_size"] == len(usable)
        assert set(row[S.POSITIVE_TEXTS]) <= {c[S.TEXT] for c in usable}
        assert row[S.TEXT] not in row[S.POSITIVE_TEXTS] or any(
            c[S.TEXT] == row[S.TEXT] for c in usable
        )
        meta = {c[S.CANDIDATE_ID]: c for c in kept}
        for j, cid in enumerate(row[S.POSITIVE_IDS]):
            assert row[S.POSITIVE_ROUTES][j] == meta[cid][S.ROUTE]
            assert row[S.POSITIVE_NOISES][j] == meta[cid][S.NOISE]
            assert row[S.POSITIVE_TEXTS][j] == meta[cid][S.TEXT]
        if usable:
            edit = [
                Levenshtein.normalized_distance(
                    tokenize_words(row[S.TEXT]), tokenize_words(c[S.TEXT])
                )
                for c in usable
            ]
            s_sur = 1 - _hand_softmax(edit)
            order = {c[S.CANDIDATE_ID]: k for k, c in enumerate(usable)}
            for j, cid in enumerate(row[S.POSITIVE_IDS]):
                k = order[cid]
                assert row["positive_edit"][j] == pytest.approx(edit[k], abs=1e-6)
                assert row["positive_s_sur"][j] == pytest.approx(s_sur[k], abs=1e-6)
        for col, id_col, route in (
            (S.POSITIVE_TEXT, S.POSITIVE_TEXT_ID, "en-zh-en"),
            (S.VIEW1_TEXT, S.VIEW1_ID, "en-de-en"),
            (S.VIEW2_TEXT, S.VIEW2_ID, "en-fr-en"),
        ):
            options = [c for c in kept if c[S.ROUTE] == route]
            if not options:
                assert row[col] is None and row[id_col] is None
                continue
            chosen = meta[row[id_col]]
            assert chosen[S.ROUTE] == route and row[col] == chosen[S.TEXT]
            if any(c[S.NOISE] == "none" for c in options):
                assert chosen[S.NOISE] == "none"  # the plain back-translation first
    assert identical_total > 0
    assert metrics["counts"]["identical_skipped"] == identical_total
    assert metrics["counts"]["repeated_positive_text"] == repeated_total > 0


def test_draws_follow_p_over_many_seeds():
    # One scored pool tiled 4000 times: the first draw of each copy must follow P (chi-square).
    edit = np.array([0.2, 0.5, 0.9, 0.4])
    cos = np.array([0.3, 0.6, 0.5, 0.7])
    n = 4000
    scored = score_pools(
        np.tile(edit, n), np.tile(cos, n), np.arange(n + 1) * 4, "negative", 0.8, 0.05
    )
    p = scored.prob[:4]
    assert p.max() > 0.4  # a sharp distribution at temperature 0.05: the test can tell
    drawn = draw(scored, 2, np.random.default_rng(7))
    first = drawn.indices[drawn.offsets[:-1]] % 4
    assert chisquare(np.bincount(first, minlength=4), n * p).pvalue > 1e-3
    assert chisquare(np.bincount(first, minlength=4), np.full(4, n / 4)).pvalue < 1e-3


def test_seeded_and_reproducible(mined, sampled, tmp_path):
    root, _ = sampled
    other = copy_project(mined, tmp_path)
    run(_cfg(other, corpus_name="test corpus", corpus_license="CC0-1.0"), progress=False)
    a = open_dataset(root / "data/pairs", S.PAIRS)
    b = open_dataset(other / "data/pairs", S.PAIRS)
    assert [s["sha256"] for s in a.manifest["shards"]] == [
        s["sha256"] for s in b.manifest["shards"]
    ]
    shutil.rmtree(other / "data/pairs")
    run(_cfg(other, seed=1), progress=False)
    c = open_dataset(other / "data/pairs", S.PAIRS).read_table([S.NEGATIVE_IDS])
    assert c[S.NEGATIVE_IDS] != a.read_table([S.NEGATIVE_IDS])[S.NEGATIVE_IDS]


def test_edit_backends_write_identical_pairs(mined, sampled, tmp_path):
    root, metrics = sampled
    assert metrics["edit"]["backend"] == "numba" and metrics["edit"]["encode_seconds"] >= 0
    # How the kernels were had (compiled or loaded) and the wait, apart from the scoring rate.
    assert metrics["edit"]["kernels"] in ("compiled", "loaded")
    assert metrics["edit"]["compile_seconds"] >= 0
    other = copy_project(mined, tmp_path)
    cfg = _cfg(other, corpus_name="test corpus", corpus_license="CC0-1.0", edit_backend="rapidfuzz")
    ref = run(cfg, progress=False)["edit"]
    assert ref["backend"] == "rapidfuzz" and ref["kernels"] is None is ref["compile_seconds"]
    a = open_dataset(root / "data/pairs", S.PAIRS)
    b = open_dataset(other / "data/pairs", S.PAIRS)
    assert [s["sha256"] for s in a.manifest["shards"]] == [
        s["sha256"] for s in b.manifest["shards"]
    ]
    # The backend is not in the fingerprint: switching it keeps the finished shards.
    again = run(cfg.model_copy(update={"edit_backend": "numba", "threads": 1}), progress=False)
    assert again["computed_shards"] == 0 and again["edit"]["backend"] is None


def test_metrics_report_entropy_and_counts(sampled):
    root, metrics = sampled
    saved = read_json(root / "metrics/sample.json")
    assert saved["rows"] == 240 == saved["anchors"]
    assert 0.9 < saved["entropy_ratio"]["negative"]["mean"] <= 1.0
    counts = saved["counts"]
    assert counts["negatives_sampled"] == sum(
        min(2, s)
        for s in open_dataset(root / "data/pairs", S.PAIRS)
        .read_table()["negative_pool_size"]
        .to_pylist()
    )
    assert saved["edit"]["kind"] == "word" and saved["edit"]["pairs_per_second"] > 0


def test_short_policies(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    with pytest.raises(PairforgeError, match="fewer than m=300"):
        run(_cfg(root, m=300, short="error"), progress=False)
    sizes = [
        len(r)
        for r in open_dataset(root / "data/pools", S.POOLS).read_table()[S.POOL_ROWS].to_pylist()
    ]
    m = int(np.median(sizes))
    metrics = run(_cfg(root, m=m, short="drop"), progress=False)
    dropped = metrics["counts"]["dropped_short"]
    assert dropped == sum(s < m for s in sizes) and 0 < dropped < 240
    assert metrics["rows"] == 240 - dropped
    table = open_dataset(root / "data/pairs", S.PAIRS).read_table()
    assert all(len(x) == m for x in table[S.NEGATIVE_TEXTS].to_pylist())


def test_all_pools_empty_is_a_clear_error(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    paths = _paths(root)
    mine(
        MineConfig(
            sentences=paths["sentences"],
            embeddings=paths["embeddings"],
            output=paths["pools"],
            metrics=str(root / "m.json"),
            band_low=0.999,
            band_high=1.0,
            fallback="none",
        ),
        progress=False,
    )
    with pytest.raises(PairforgeError, match="every negative pool .* is empty"):
        run(_cfg(root), progress=False)


def test_dimension_mismatch_is_a_clear_error(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    cands = open_dataset(root / "data/candidates", S.CANDIDATES)
    ids = cands.read_table([S.CANDIDATE_ID])[S.CANDIDATE_ID].to_pylist()
    v = unit(np.random.default_rng(0).standard_normal((len(ids), 8)))
    write_embeddings(
        root / "data/embeddings/candidates", ids, v, [s["rows"] for s in cands.manifest["shards"]]
    )
    with pytest.raises(PairforgeError, match="dimension mismatch: .* 16-d .* 8-d"):
        run(_cfg(root), progress=False)


def test_other_encoder_is_a_clear_error(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    cands = open_dataset(root / "data/candidates", S.CANDIDATES)
    ids = cands.read_table([S.CANDIDATE_ID])[S.CANDIDATE_ID].to_pylist()
    v = unit(np.random.default_rng(0).standard_normal((len(ids), 16)))
    rows = [s["rows"] for s in cands.manifest["shards"]]
    write_embeddings(root / "data/embeddings/candidates", ids, v, rows, {**INFO, "pooling": "cls"})
    with pytest.raises(PairforgeError, match="different encoders .*pooling: 'mean' vs 'cls'"):
        run(_cfg(root), progress=False)
    # The same model run int8 by CTranslate2 is another encoder too (a manifest naming no
    # engine was written by transformers).
    int8 = {**INFO, "engine": "ctranslate2", "compute_type": "int8"}
    write_embeddings(root / "data/embeddings/candidates", ids, v, rows, int8)
    with pytest.raises(PairforgeError, match="engine: 'transformers' vs 'ctranslate2'"):
        run(_cfg(root), progress=False)


def test_two_int8_recipes_are_other_encoders():
    """onnxruntime's int8 made by two recipes (two CPUs may pick other weights) are two
    encoders; one recipe on both sides is one."""
    from types import SimpleNamespace

    from pairforge.pipeline.science.mining_inputs import ENCODER_KEY, check_same_encoder

    onnx = {**INFO, "engine": "onnxruntime", "compute_type": "int8"}

    def embeddings(path, recipe):
        return SimpleNamespace(path=path, manifest={ENCODER_KEY: {**onnx, "int8_recipe": recipe}})

    u8 = embeddings("sentences", "ffn_output-uint8-smooth0.8")
    check_same_encoder(u8, embeddings("candidates", "ffn_output-uint8-smooth0.8"))
    with pytest.raises(PairforgeError, match="int8_recipe: 'ffn_output-uint8-smooth0.8' vs 'ffn_o"):
        check_same_encoder(u8, embeddings("candidates", "ffn_output-int8-smooth0.8"))


def test_without_candidates_negatives_only(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    metrics = run(_cfg(root, candidates=None), progress=False)
    assert metrics["candidates"]["status"] == "disabled"
    assert metrics["counts"]["no_positive"] == 240 and metrics["counts"]["negatives_sampled"] > 0
    table = open_dataset(root / "data/pairs", S.PAIRS).read_table()
    assert table[S.POSITIVE_TEXT].null_count == 240


def test_char_level_indel_option(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    run(_cfg(root, edit_kind="char", edit_metric="indel"), progress=False)
    row = open_dataset(root / "data/pairs", S.PAIRS).read_table().slice(0, 1).to_pylist()[0]
    texts = {
        n: t
        for n, t in zip(
            *open_dataset(root / "data/sentences", S.SENTENCES)
            .read_table([S.ID, S.TEXT])
            .to_pydict()
            .values(),
            strict=True,
        )
    }
    from rapidfuzz.distance import Indel

    for j, nid in enumerate(row[S.NEGATIVE_IDS]):
        want = Indel.normalized_distance(row[S.TEXT], texts[nid])
        assert row["negative_edit"][j] == pytest.approx(want, abs=1e-6)


def test_four_readers_and_the_card(sampled):
    root, metrics = sampled
    folder = root / "data/pairs"
    assert (folder / CARD).exists() and (folder / "_manifest.json").exists()
    # The manifest names the encoder the pools were mined with (a receiving team trains it),
    # not how it ran (no engine, device or precision: those are the embeddings').
    encoder = open_dataset(folder, S.PAIRS).manifest["encoder"]
    assert encoder == {"model": "test", "pooling": "mean", "max_length": 32, "prompt": None,
                       "dim": 16}  # fmt: skip
    assert (
        open_embeddings(root / "data/embeddings/sentences").manifest["encoder"]["model"] == "test"
    )
    want = open_dataset(folder, S.PAIRS).read_table([S.ID, S.NEGATIVE_TEXTS]).to_pylist()
    want_neg = {r[S.ID]: r[S.NEGATIVE_TEXTS] for r in want}

    import polars as pl

    df = pl.read_parquet(folder / "data")  # data/ holds only the shards
    assert df.height == 240 and df.schema[S.NEGATIVE_TEXTS] == pl.List(pl.String)
    assert dict(zip(df[S.ID].to_list(), df[S.NEGATIVE_TEXTS].to_list(), strict=True)) == want_neg

    import pyarrow.dataset as ds

    table = ds.dataset(folder / "data").to_table(columns=[S.ID, S.NEGATIVE_TEXTS])
    assert (
        dict(zip(table[S.ID].to_pylist(), table[S.NEGATIVE_TEXTS].to_pylist(), strict=True))
        == want_neg
    )

    import duckdb

    rows = duckdb.sql(
        f"select id, len(negative_texts), positive_text from '{folder}/data/*.parquet'"
    ).fetchall()
    assert {r[0]: r[1] for r in rows} == {k: len(v) for k, v in want_neg.items()}

    import datasets

    # The folder as a Hub dataset: the card's front matter points at data/*.parquet.
    assert (folder / CARD).read_text().startswith("---\nconfigs:")
    meta = yaml.safe_load((folder / CARD).read_text().split("---\n")[1])
    assert meta["size_categories"] == ["n<1K"] and meta["pretty_name"].startswith("test corpus")
    assert "debcse" in meta["tags"] and "source_datasets" not in meta
    d = datasets.load_dataset(str(folder), split="train", cache_dir=str(root / "hf-cache"))
    assert d.num_rows == 240 and S.POSITIVE_TEXTS in d.column_names
    assert {
        r[S.ID]: r[S.NEGATIVE_TEXTS] for r in d.select_columns([S.ID, S.NEGATIVE_TEXTS])
    } == want_neg

    card = (folder / CARD).read_text()
    for heading in (
        "## How it was mined",
        "## Counts",
        "## Score distributions",
        "## Source corpus and licence",
        "## Loading",
    ):
        assert heading in card
    assert "CC0-1.0" in card and "test corpus" in card
    flat = " ".join(card.split())
    assert "Negatives drawn by P_neg from every pool candidate" in flat
    assert "keyed draws (each candidate's random number hashed from the seed" in flat
    made = open_dataset(root / "data/candidates", S.CANDIDATES).manifest
    engine = "stand-in" if made.get("standin") else (made.get("engine") or {}).get("engine")
    # The fixture's candidates name no engine; a stage's name theirs (test_selection.py).
    assert engine is None and "candidates (used)" in flat
    assert f"| negatives_sampled | {metrics['counts']['negatives_sampled']:,} |" in card
    assert "| negative_prob |" in card


def test_export_layouts(sampled, tmp_path):
    from pairforge.stages.cli import app
    from typer.testing import CliRunner

    root, _ = sampled
    table = open_dataset(root / "data/pairs", S.PAIRS).read_table()
    n_pos = [len(x) for x in table[S.POSITIVE_TEXTS].to_pylist()]
    n_neg = [len(x) for x in table[S.NEGATIVE_TEXTS].to_pylist()]
    runner = CliRunner()
    for fmt, want in (
        ("triplet", sum(p * n for p, n in zip(n_pos, n_neg, strict=True))),
        ("pair", sum(n_pos)),
        ("n-tuple", sum(p for p, n in zip(n_pos, n_neg, strict=True) if n >= 2)),
    ):
        out = tmp_path / fmt
        result = runner.invoke(
            app,
            ["export", "--input", str(root / "data/pairs"), "--output", str(out), "--format", fmt],
        )
        assert result.exit_code == 0, result.output
        assert f"{want:,} {fmt} rows" in result.output
        import datasets

        # A fresh cache: datasets keys its cache by path, and pytest reuses tmp paths across runs.
        d = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
        assert d.num_rows == want
        cols = {"triplet": ["anchor", "positive", "negative"], "pair": ["anchor", "positive"]}
        assert d.column_names == cols.get(fmt, ["anchor", "positive", "negative_1", "negative_2"])
        first = d[0]
        row = table.filter(
            __import__("pyarrow.compute", fromlist=["equal"]).equal(table[S.TEXT], first["anchor"])
        ).to_pylist()[0]
        assert first["positive"] in row[S.POSITIVE_TEXTS]
        if fmt == "triplet":
            assert first["negative"] in row[S.NEGATIVE_TEXTS]
    bad = runner.invoke(app, ["export", "--input", str(root / "data/pairs"), "--format", "csv"])
    assert bad.exit_code == 2 and "allowed values: triplet, n-tuple, pair" in bad.output


def test_small_anchor_batches_cover_every_anchor(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    metrics = run(_cfg(root, anchor_batch=7), progress=False)
    table = open_dataset(root / "data/pairs", S.PAIRS).read_table()
    sentences = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])
    assert table[S.ID].equals(sentences[S.ID])
    assert metrics["counts"]["anchors"] == 240 and metrics["rows"] == 240


def test_keyed_draws_are_the_same_pairs_whatever_the_anchor_batches(mined, sampled, tmp_path):
    """The default draws are keyed by (seed, anchor, candidate): scoring the anchors 7 at a time
    writes the same pairs as all at once. Drawn from one generator per batch, they differ."""
    root, _ = sampled
    card = dict(corpus_name="test corpus", corpus_license="CC0-1.0")
    other = copy_project(mined, tmp_path / "keyed")
    assert run(_cfg(other, anchor_batch=7, **card), progress=False)["params"]["draws"] == "keyed"
    keyed = open_dataset(root / "data/pairs", S.PAIRS)
    batched = open_dataset(other / "data/pairs", S.PAIRS)
    assert [s["sha256"] for s in keyed.manifest["shards"]] == [
        s["sha256"] for s in batched.manifest["shards"]
    ]
    streams = []
    for batch in (16384, 7):
        folder = copy_project(mined, tmp_path / f"stream-{batch}")
        run(_cfg(folder, anchor_batch=batch, draws="stream", **card), progress=False)
        cols = [S.NEGATIVE_IDS, S.POSITIVE_IDS]
        streams.append(open_dataset(folder / "data/pairs", S.PAIRS).read_table(cols))
        text = " ".join((folder / "data/pairs" / CARD).read_text().split())
        assert "one random generator per (seed, shard, anchor batch)" in text
    assert streams[0][S.NEGATIVE_IDS] != streams[1][S.NEGATIVE_IDS]
    assert streams[0][S.NEGATIVE_IDS] != keyed.read_table([S.NEGATIVE_IDS])[S.NEGATIVE_IDS]


# --- the LLM rewrites as a second positive source ------------------------------------------------


def _rewrite_rows(n: int, root) -> list[dict]:
    """Rewrites (route llm, as the rewrite stage writes them) of the first n sentences: the
    words reversed, so that each differs from its sentence and from its candidates."""
    table = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID, S.TEXT])
    rows = []
    for sid, text in list(zip(*table.to_pydict().values(), strict=True))[:n]:
        rewrite = " ".join(text.split()[::-1])
        rows.append(
            {
                S.ID: sid,
                S.CANDIDATE_ID: f"llm-{sid}",
                S.TEXT: rewrite,
                S.ROUTE: "llm",
                S.ENGINE: "openai",
                S.MODEL: "test-llm",
                S.DECODING: "chat(temperature=1.0,max_tokens=128)",
                S.NOISE: "none",
                S.NOISED_TEXT: text,
                S.PIVOT: None,
                S.IDENTICAL: False,
                S.LENGTH_RATIO: 1.0,
                S.EDIT_RATIO: 0.5,
            }
        )
    return rows


def _write_rewrites(root, n: int, with_embeddings: bool = True) -> list[dict]:
    rows = _rewrite_rows(n, root)
    write_candidates(root / "data/rewrites", rows, rows_per_shard=50)
    if with_embeddings:
        ids = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])[S.ID]
        v = load_vectors(open_embeddings(root / "data/embeddings/sentences"), ids.combine_chunks())
        rng = np.random.default_rng(5)
        rv = unit(v[:n] + 0.3 * rng.standard_normal((n, v.shape[1])))
        shards = [len(rows[i : i + 50]) for i in range(0, n, 50)]
        write_embeddings(
            root / "data/embeddings/rewrites", [r[S.CANDIDATE_ID] for r in rows], rv, shards, INFO
        )
    return rows


def test_rewrites_are_a_second_positive_source(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    rewrites = {r[S.ID]: r for r in _write_rewrites(root, 120)}
    # m_positive above every pool size: each usable positive is drawn, so all can be checked.
    metrics = run(_cfg(root, m_positive=8), progress=False)
    assert metrics["rewrites"] == {"status": "used", "rows": 120, "orphans": 0}
    assert metrics["positive_routes"]["llm"] == 120
    pairs = open_dataset(root / "data/pairs", S.PAIRS).read_table().to_pylist()
    cands = open_dataset(root / "data/candidates", S.CANDIDATES).read_table().to_pylist()
    kept: dict[str, list[dict]] = {}
    for c in cands:
        if not c[S.IDENTICAL]:
            kept.setdefault(c[S.ID], []).append(c)
    usable = {a: len(_distinct(cs)) for a, cs in kept.items()}
    ids = open_dataset(root / "data/sentences", S.SENTENCES).read_table([S.ID])[S.ID]
    vectors = load_vectors(
        open_embeddings(root / "data/embeddings/sentences"), ids.combine_chunks()
    )
    rv = load_vectors(
        open_embeddings(root / "data/embeddings/rewrites"),
        pa.array([f"llm-{x}" for x in ids.to_pylist()[:120]]),
    )
    row_of = {x: i for i, x in enumerate(ids.to_pylist())}
    seen = 0
    for row in pairs:
        own = rewrites.get(row[S.ID])
        texts = {match_key(c[S.TEXT]) for c in kept.get(row[S.ID], [])}
        new = own is not None and match_key(own[S.TEXT]) not in texts
        assert row["positive_pool_size"] == usable.get(row[S.ID], 0) + new
        assert ("llm" in row[S.POSITIVE_ROUTES]) == (own is not None)
        if own is None:
            continue
        j = row[S.POSITIVE_ROUTES].index("llm")
        assert row[S.POSITIVE_IDS][j] == own[S.CANDIDATE_ID]
        assert row[S.POSITIVE_TEXTS][j] == own[S.TEXT]
        want = Levenshtein.normalized_distance(
            tokenize_words(row[S.TEXT]), tokenize_words(own[S.TEXT])
        )
        assert row["positive_edit"][j] == pytest.approx(want, abs=1e-6)
        cos = float(vectors[row_of[row[S.ID]]] @ rv[row_of[row[S.ID]]])
        assert row["positive_cos"][j] == pytest.approx(cos, abs=1e-5)
        seen += 1
    assert seen == 120
    # DenoSent's single positive can come from the LLM route.
    shutil.rmtree(root / "data/pairs")
    run(_cfg(root, positive_route="llm"), progress=False)
    table = open_dataset(root / "data/pairs", S.PAIRS).read_table([S.ID, S.POSITIVE_TEXT_ID])
    got = dict(zip(*table.to_pydict().values(), strict=True))
    assert all(got[sid] == r[S.CANDIDATE_ID] for sid, r in rewrites.items())
    assert sum(v is None for v in got.values()) == 240 - 120


def test_empty_rewrites_change_nothing(mined, sampled, tmp_path):
    from pairforge.stages.rewrite.stage import RewriteConfig
    from pairforge.stages.rewrite.stage import run as rewrite

    root, _ = sampled
    other = copy_project(mined, tmp_path)
    # The demo's case: rewrite disabled writes an empty, complete dataset; embed not rerun.
    rewrite(
        RewriteConfig(
            enabled=False,
            output=str(other / "data/rewrites"),
            quarantine=str(other / "data/quarantine/rewrite"),
            metrics=str(other / "metrics/rewrite.json"),
        ),
        None,
    )
    metrics = run(_cfg(other, corpus_name="test corpus", corpus_license="CC0-1.0"), progress=False)
    assert metrics["rewrites"] == {"status": "empty", "rows": 0}
    a = open_dataset(root / "data/pairs", S.PAIRS)
    b = open_dataset(other / "data/pairs", S.PAIRS)
    assert [s["sha256"] for s in a.manifest["shards"]] == [
        s["sha256"] for s in b.manifest["shards"]
    ]
    off = run(_cfg(other, rewrites=None, output=str(other / "off")), progress=False)
    assert off["rewrites"]["status"] == "disabled"


def test_rewrites_schema_and_embedding_errors(mined, tmp_path):
    root = copy_project(mined, tmp_path)
    shutil.copytree(root / "data/sentences", root / "data/rewrites")  # a sentences dataset
    with pytest.raises(SchemaError, match="data/rewrites.*expected schema candidates"):
        run(_cfg(root), progress=False)
    shutil.rmtree(root / "data/rewrites")
    _write_rewrites(root, 30, with_embeddings=False)
    with pytest.raises(IncompleteDatasetError, match=r"run embed \(embed.rewrites"):
        run(_cfg(root), progress=False)
    shutil.rmtree(root / "data/rewrites")
    rows = _rewrite_rows(3, root)
    cand = open_dataset(root / "data/candidates", S.CANDIDATES).read_table([S.CANDIDATE_ID])
    rows[1][S.CANDIDATE_ID] = cand[S.CANDIDATE_ID][0].as_py()  # an id the candidates hold
    write_candidates(root / "data/rewrites", rows, rows_per_shard=50)
    ids = [r[S.CANDIDATE_ID] for r in rows]
    write_embeddings(root / "data/embeddings/rewrites", ids, unit(np.ones((3, 16))), [3], INFO)
    with pytest.raises(DataIntegrityError, match="unique across candidates and rewrites"):
        run(_cfg(root), progress=False)


def test_sharpness_is_reported_and_near_uniform_is_flagged(mined, sampled, tmp_path):
    _, paper = sampled  # the equations as printed
    neg = paper["sharpness"]["negative"]
    assert paper["sharpness"]["ipw"] == "paper" and neg["near_uniform"] is True
    assert neg["entropy_ratio"]["mean"] > 0.99 and neg["effective_share"]["mean"] > 0.95
    card = (sampled[0] / "data/pairs" / CARD).read_text()
    assert "## How sharp the sampling is" in card and "negative sampling is NEAR-UNIFORM" in card

    root = copy_project(mined, tmp_path)
    metrics = run(_cfg(root, ipw="calibrated", temperature=0.5), progress=False)
    sharp = metrics["sharpness"]
    assert sharp["ipw"] == "calibrated" and sharp["temperature"] == 0.5
    for side in ("negative", "positive"):
        s = sharp[side]
        assert s["near_uniform"] is False
        assert s["entropy_ratio"]["mean"] < neg["entropy_ratio"]["mean"] - 0.05
        assert s["effective_candidates"]["p50"] >= 1.0
        assert 0 < s["effective_share"]["mean"] < 0.9
    card = (root / "data/pairs" / CARD).read_text()
    assert "NEAR-UNIFORM" not in card and "Neither side is near-uniform" in card
    # The same pools and seed: only P changed, and it now prefers lower-cosine negatives.
    assert metrics["scores"]["negative_cos"]["mean"] < paper["scores"]["negative_cos"]["mean"]


def test_uniform_option_draws_with_equal_probability_within_each_pool(mined, tmp_path):
    """ipw: uniform, the control of benchmarks/quality.py: P = 1/n of each pool, both sides."""
    root = copy_project(mined, tmp_path)
    metrics = run(_cfg(root, ipw="uniform"), progress=False)
    sharp = metrics["sharpness"]
    assert sharp["ipw"] == "uniform" and metrics["params"]["ipw"] == "uniform"
    for side in ("negative", "positive"):
        assert sharp[side]["entropy_ratio"]["mean"] == pytest.approx(1.0, abs=1e-9)
    pairs = open_dataset(root / "data/pairs", S.PAIRS).read_table()
    for side in ("negative", "positive"):
        probs = pairs[f"{side}_prob"].to_pylist()
        sizes = pairs[f"{side}_pool_size"].to_pylist()
        drawn = [(p, n) for ps, n in zip(probs, sizes, strict=True) for p in ps]
        assert drawn, side
        assert all(p == pytest.approx(1.0 / n, rel=1e-6) for p, n in drawn), side
    assert "uniform: 1/n within each pool" in (root / "data/pairs" / CARD).read_text()
    with pytest.raises(Exception, match="ipw"):
        _cfg(root, ipw="flat")
