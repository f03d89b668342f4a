"""The pure parts: batch planning, DebCSE noise, quality signals, decoding labels, the cache."""

from __future__ import annotations

import pickle
import re
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pairforge.pipeline.plumbing.cache import KeyValueCache, cache_key
from pairforge.pipeline.science.candidate_quality import quality_signals
from pairforge.stages.backtranslate.batching import plan_batches
from pairforge.stages.backtranslate.decoding import Decoding, Lengths
from pairforge.stages.backtranslate.noise import (
    NoiseSettings,
    frequent_words,
    noise_kind,
    noise_variants,
)
from pydantic import ValidationError


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), max_size=80),
    max_tokens=st.integers(1, 400),
    max_sentences=st.integers(1, 20),
)
def test_plan_batches_covers_every_item_once_within_budget(lengths, max_tokens, max_sentences):
    keys = [f"t{i % 7}" for i in range(len(lengths))]
    batches = plan_batches(lengths, max_tokens, max_sentences, keys)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)  # shortest first
    for b in batches:
        assert len(b) <= max_sentences
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens
    # Memoryless at batch boundaries: planning what is left after k batches gives the rest.
    for k in range(len(batches)):
        rest = [i for b in batches[k:] for i in b]
        again = plan_batches(
            [lengths[i] for i in rest], max_tokens, max_sentences, [keys[i] for i in rest]
        )
        assert [[rest[j] for j in b] for b in again] == batches[k:]


def _settings(**kw) -> NoiseSettings:
    base = dict(
        copies=3,
        kinds=("insert", "mask"),
        min_words=1,
        max_words=2,
        vocabulary=("the", "of", "and"),
        mask_token="<unk>",
        seed=5,
    )
    return NoiseSettings(**{**base, **kw})


def _apply(label: str, text: str, mask_token: str) -> str:
    """Rebuild a noised text from its recorded label (the label must say exactly what was done)."""
    words = text.split()
    if label == "none":
        return text
    if label.startswith("mask@"):
        for pos in map(int, label[5:].split(",")):
            words[pos] = mask_token
        return " ".join(words)
    inserts = [(int(p), w) for w, p in (item.split("@") for item in label[7:].split(","))]
    for pos, word in sorted(inserts, reverse=True):
        words.insert(pos, word)
    return " ".join(words)


def test_noise_is_seeded_recorded_and_distinct():
    text = "The river rose quickly after three days of heavy rain in the hills."
    variants, collisions = noise_variants("abc", text, _settings())
    assert variants[0] == ("none", text) and collisions == 0 and len(variants) == 4
    assert noise_variants("abc", text, _settings()) == (variants, 0)  # seeded
    assert noise_variants("abd", text, _settings())[0] != variants  # per sentence
    assert noise_variants("abc", text, _settings(seed=6))[0] != variants
    labels = [label for label, _ in variants]
    assert len(set(labels)) == 4 and len({t for _, t in variants}) == 4
    for label, noised in variants:
        assert re.fullmatch(r"none|mask@\d+(,\d+)?|insert:[a-z]+@\d+(,[a-z]+@\d+)?", label)
        assert _apply(label, text, "<unk>") == noised
        n_changed = 0 if label == "none" else len(label.split(","))
        assert n_changed <= 2
    kinds = {noise_kind(label) for label, _ in noise_variants("x", text, _settings(copies=20))[0]}
    assert kinds == {"none", "insert", "mask"}


def test_noise_on_short_sentences_and_without_vocabulary():
    variants, collisions = noise_variants("s", "Hi", _settings(kinds=("mask",), copies=3))
    assert variants == [("none", "Hi")] and collisions == 3  # masking the only word is refused
    only_mask, _ = noise_variants("s", "One two three four", _settings(vocabulary=(), copies=2))
    assert all(label.startswith(("none", "mask@")) for label, _ in only_mask)
    assert noise_variants("s", "One two", _settings(copies=0)) == ([("none", "One two")], 0)


def test_frequent_words_are_lowercase_alphabetic_by_count():
    texts = ["The cat and the dog.", "THE end, and 42 more", "the"]
    assert frequent_words(texts, 2) == ["the", "and"]


def test_quality_signals():
    identical, length, edit = quality_signals(
        ["A b  c.", "abcd", "abcd", "x"], ["A  b c.", "abcd!!!!", "wxyz", ""]
    )
    assert identical.tolist() == [True, False, False, False]
    assert length.tolist() == pytest.approx([1.0, 2.0, 1.0, 0.0])
    assert edit[0] > 0  # spacing differs: not an edit-free copy, still flagged identical
    assert edit[1] == pytest.approx(4 / 12) and edit[2] == pytest.approx(1.0) and edit[3] == 1.0


def test_decoding_labels_and_validation():
    assert Decoding().candidate_labels() == ["greedy"]
    assert Decoding(strategy="beam", beams=5).label() == "beam(5)"
    sample = Decoding(strategy="sample", top_k=50, top_p=0.95, n=2)
    assert sample.candidate_labels() == [
        "sample(top_k=50,top_p=0.95,temperature=1.0)#0",
        "sample(top_k=50,top_p=0.95,temperature=1.0)#1",
    ]
    with pytest.raises(ValidationError, match="n must be 1"):
        Decoding(n=2)
    with pytest.raises(ValidationError, match="must not exceed beams"):
        Decoding(strategy="beam", beams=2, n=3)
    assert Lengths(max_length=100, max_length_ratio=1.5).output_limit(10) == 23
    assert Lengths(max_length=20, max_length_ratio=1.5).output_limit(40) == 20
    assert Lengths(max_length=9, min_length=9, max_length_ratio=None).output_limit(3) == 9


def test_key_value_cache_persists_shares_and_pickles(tmp_path):
    path = tmp_path / "c" / "cache.sqlite"
    cache = KeyValueCache(path, "translations")
    k1, k2 = cache_key({"text": "a"}), cache_key({"text": "b"})
    assert cache.get_many([k1, k2]) == {}
    cache.put_many({k1: ["x", "y"], k2: ["ü"]})
    cache.put_many({k1: ["changed"]})  # first value wins
    other = pickle.loads(pickle.dumps(cache))  # what a Dask worker gets
    assert other.get_many([k1, k2, "missing"]) == {k1: ["x", "y"], k2: ["ü"]}
    assert len(other) == 2
    many = {cache_key({"i": i}): i for i in range(1200)}  # more than one SQL chunk
    other.put_many(many)
    assert KeyValueCache(path, "translations").get_many(many) == many
    tables = sqlite3.connect(path).execute("select name from sqlite_master").fetchall()
    assert ("translations",) in tables
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})
