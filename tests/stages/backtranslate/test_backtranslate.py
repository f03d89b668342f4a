"""The backtranslate stage end to end (in-process): candidates, counts, dedup, cache, stand-ins."""

from __future__ import annotations

import json

import pairforge.stages.backtranslate.engines as engines
import pyarrow.compute as pc
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.stages.backtranslate.stage import BacktranslateConfig, run
from pairforge.stages.standin.stage import StandinConfig
from pairforge.stages.standin.stage import run as run_standin

from tests.stages.augment_helpers import make_sentences, write_sentences


@pytest.fixture()
def counted(monkeypatch):
    """Count the texts every translator is asked to translate (the work the cache must save)."""
    calls = {"texts": 0, "batches": 0}
    original = engines.load_translator

    def load(ref, settings):
        translator = original(ref, settings)

        class Counting:
            def __init__(self) -> None:
                self.ref, self.settings, self.tokenizer = (
                    translator.ref,
                    translator.settings,
                    translator.tokenizer,
                )

            def encode(self, texts, max_tokens):
                return translator.encode(texts, max_tokens)

            def translate(self, batch, decoding, max_new, min_new, seed):
                calls["texts"] += len(batch)
                calls["batches"] += 1
                return translator.translate(batch, decoding, max_new, min_new, seed)

        return Counting()

    monkeypatch.setattr(engines, "load_translator", load)
    return calls


def config(
    tmp_path, copy_marian, tiny_marian, name="candidates", input="sentences", **kw
) -> BacktranslateConfig:
    values = {
        "input": str(tmp_path / input),
        "output": str(tmp_path / name),
        "metrics": str(tmp_path / f"metrics/{name}.json"),
        "plot": str(tmp_path / f"plots/{name}.png"),
        "cache": str(tmp_path / "cache/translations.sqlite"),
        "models_dir": str(tmp_path / "cache/ct2"),
        "engine": "ctranslate2",
        "compute_type": "float32",
        "threads": 1,
        "max_batch_tokens": 400,
        "max_batch_sentences": 16,
        "routes": [
            {
                "name": "en-xx-en",
                "forward": str(copy_marian),
                "backward": str(copy_marian),
                "noise": True,
                "decodings": [
                    {"strategy": "greedy"},
                    {"strategy": "sample", "top_k": 10, "n": 2},
                ],
            },
            {"name": "en-yy-en", "forward": str(tiny_marian), "backward": str(tiny_marian)},
        ],
        "noise": {"copies": 2, "vocabulary": ["the", "of", "and"]},
        **kw,
    }
    return BacktranslateConfig.model_validate(values)


def test_stage_writes_scored_candidates_and_accounts_for_every_translation(
    tmp_path, copy_marian, tiny_marian, counted
):
    base = make_sentences(50, seed=3)
    # Ten texts twice, under other ids and in the same shard: dedup must translate them once.
    texts = base[:25] + base[:5] + base[25:] + base[25:30]
    ids = [f"{i:016x}" for i in range(60)]
    write_sentences(tmp_path / "sentences", texts, rows_per_shard=30, ids=ids)
    metrics = run(config(tmp_path, copy_marian, tiny_marian), LocalExecutor(), progress=False)

    cands = open_dataset(tmp_path / "candidates", S.CANDIDATES).read_table()
    assert metrics["sentences_in"] == 60 and metrics["shards"] == 2
    assert cands.num_rows == metrics["candidates_out"] == 60 * 3 * 3 + 60
    assert len(set(cands[S.CANDIDATE_ID].to_pylist())) == cands.num_rows
    assert set(cands[S.ID].to_pylist()) == set(ids)
    t = metrics["translations"]
    assert t["requested"] == t["dedup_saved"] + t["cache_hits"] + t["performed"]
    assert t["performed"] == counted["texts"] > 0
    # The ten repeated texts, once per route; their noised copies differ (noise is seeded by the
    # sentence id), so nothing else is saved.
    assert metrics["routes"]["en-xx-en"]["forward"]["dedup_saved"] == 10
    assert metrics["routes"]["en-yy-en"]["forward"]["dedup_saved"] == 10
    assert metrics["routes"]["en-xx-en"]["forward"]["requested"] == 60 * 3  # with 2 noised
    assert metrics["routes"]["en-yy-en"]["forward"]["requested"] == 60

    rows = cands.filter(pc.equal(cands[S.ROUTE], "en-xx-en")).to_pylist()
    by_id = dict(zip(ids, texts, strict=True))
    for r in rows:  # the copy model returns its input (less the mask token, a special token)
        copied = " ".join(w for w in r[S.NOISED_TEXT].split() if w != "<unk>")
        assert r[S.PIVOT] == copied
        assert r[S.ENGINE] == "ctranslate2" and r[S.MODEL] == f"{copy_marian}+{copy_marian}"
        if r[S.DECODING] == "greedy":
            assert r[S.TEXT] == copied
            assert r[S.IDENTICAL] == (r[S.NOISE] == "none") == (r[S.EDIT_RATIO] == 0.0)
        if r[S.NOISE] == "none":
            assert r[S.NOISED_TEXT] == by_id[r[S.ID]]
    decodings = {r[S.DECODING] for r in rows}
    assert decodings == {
        "greedy",
        "sample(top_k=10,top_p=1.0,temperature=1.0)#0",
        "sample(top_k=10,top_p=1.0,temperature=1.0)#1",
    }
    assert metrics["noise"]["insert"] + metrics["noise"]["mask"] == 120
    # The copy model gives back every un-noised sentence with each of the 3 decodings, and no
    # noised one: its inserted word stays, its masked word goes.
    assert metrics["routes"]["en-xx-en"]["identical"] == 60 * 3
    assert all(r[S.IDENTICAL] == (r[S.NOISE] == "none") for r in rows)
    assert metrics["routes"]["en-yy-en"]["identical"] == 0  # the random model
    assert metrics["standin"] is False
    assert (tmp_path / "plots/candidates.png").stat().st_size > 1000
    on_disk = json.loads((tmp_path / "metrics/candidates.json").read_text())
    assert on_disk == metrics


def test_rerun_and_overlapping_corpus_translate_nothing_twice(
    tmp_path, copy_marian, tiny_marian, counted
):
    texts = make_sentences(40, seed=4)
    write_sentences(tmp_path / "sentences", texts, rows_per_shard=20)
    first = run(config(tmp_path, copy_marian, tiny_marian), LocalExecutor(), progress=False)
    performed = counted["texts"]
    assert performed == first["translations"]["performed"] > 0

    counted["texts"] = 0
    again = run(
        config(tmp_path, copy_marian, tiny_marian, name="again"), LocalExecutor(), progress=False
    )
    assert counted["texts"] == 0 and again["translations"]["performed"] == 0
    assert (
        again["translations"]["cache_hits"]
        == first["translations"]["requested"] - first["translations"]["dedup_saved"]
    )
    a = open_dataset(tmp_path / "candidates", S.CANDIDATES).read_table()
    b = open_dataset(tmp_path / "again", S.CANDIDATES).read_table()
    assert a.equals(b)  # samples included: they come from the cache

    # Another corpus: half of it seen before; only the new half is translated.
    write_sentences(tmp_path / "other", texts[20:] + make_sentences(20, seed=99), rows_per_shard=20)
    counted["texts"] = 0
    other = run(
        config(tmp_path, copy_marian, tiny_marian, name="other_out", input="other"),
        LocalExecutor(),
        progress=False,
    )
    assert 0 < other["translations"]["performed"] == counted["texts"]
    assert other["translations"]["cache_hits"] > 0
    assert other["translations"]["performed"] < first["translations"]["performed"]


def test_complete_output_is_not_recomputed_and_changed_params_recompute(
    tmp_path, copy_marian, tiny_marian, counted
):
    write_sentences(tmp_path / "sentences", make_sentences(12, seed=5), rows_per_shard=6)
    cfg = config(tmp_path, copy_marian, tiny_marian, cache=None)
    run(cfg, LocalExecutor(), progress=False)
    done = counted["texts"]
    manifest = json.loads((tmp_path / "candidates/_manifest.json").read_text())
    run(cfg, LocalExecutor(), progress=False)
    assert counted["texts"] == done  # complete and unchanged: nothing to do
    assert json.loads((tmp_path / "candidates/_manifest.json").read_text()) == manifest
    changed = config(
        tmp_path, copy_marian, tiny_marian, cache=None, noise={"copies": 1, "vocabulary": ["the"]}
    )
    metrics = run(changed, LocalExecutor(), progress=False)
    assert counted["texts"] > done and metrics["noise"]["insert"] + metrics["noise"]["mask"] == 12


def test_standin_models_are_built_and_flagged_in_the_manifest(tmp_path, copy_marian, tiny_marian):
    texts = make_sentences(80, seed=6)
    write_sentences(tmp_path / "sentences", texts, rows_per_shard=40)
    models = tmp_path / "models/standin"
    written = run_standin(
        StandinConfig(
            input=str(tmp_path / "sentences"),
            output=str(models),
            pairs=["en-zz", "zz-en"],
            vocab_size=300,
            synonyms=None,
        )
    )
    assert set(written) == {"en-zz", "zz-en"} and (models / "README.md").exists()
    cfg = config(
        tmp_path,
        copy_marian,
        tiny_marian,
        routes=[
            {
                "name": "en-zz-en",
                "forward": str(models / "opus-mt-en-zz"),
                "backward": str(models / "opus-mt-zz-en"),
            }
        ],
    )
    metrics = run(cfg, LocalExecutor(), progress=False)
    manifest = open_dataset(tmp_path / "candidates", S.CANDIDATES).manifest
    assert manifest["standin"]["note"].startswith("STAND-IN MODEL, NOT A TRANSLATION MODEL")
    assert metrics["standin"] is True and "NOT A TRANSLATION MODEL" in metrics["standin_note"]
    cands = open_dataset(tmp_path / "candidates", S.CANDIDATES).read_table()
    # Without a synonym table a stand-in copies: every candidate is its sentence again.
    assert cands[S.TEXT].to_pylist() == texts and all(cands[S.IDENTICAL].to_pylist())

    run_standin(StandinConfig(output=str(models), enabled=False))
    assert sorted(p.name for p in models.iterdir()) == ["README.md", "standin.json"]
