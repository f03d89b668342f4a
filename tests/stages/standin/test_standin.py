"""The demo's stand-in translators: every word they change is changed into one of its entries in
the substitution table (never an antonym or an embedding neighbour), word order and every other
word are kept, and the table is auditable in each model folder."""

from __future__ import annotations

import json
import random
import re

import pytest
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.stages.standin.synonyms import SYNONYMS, load_table, substitutions

# Sentences full of table words ("large", "almost", "began", ...) and of their antonyms and
# neighbours ("small", "opened", "breakfast"), which must come back unchanged.
SUBJECTS = ["The large dog", "Two children", "The doctor", "Our neighbours", "The students"]
VERBS = ["stayed", "began", "helped", "opened", "closed", "ended", "answered"]
TAILS = [
    "near the centre almost every morning",
    "while the small shop was closed",
    "until the breakfast was completely ready",
    "because the rubbish was often late",
    "towards the harbour at noon",
    "in the theatre with three friends",
]


def _texts(n: int = 240, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(TAILS)}." for _ in range(n)]


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+|[^\w\s]", text)


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    from pairforge.stages.standin.marian import build_standins

    folder = tmp_path_factory.mktemp("standin")
    texts = _texts()
    written = build_standins(
        texts,
        folder,
        ["en-zz", "zz-en"],
        vocab_size=400,
        synonyms="builtin",
        substitute_rate=0.5,
        sharpness=3.0,
        seed=0,
    )
    return folder, texts, written


def _translate(folder, texts, sample=False):
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tok = MarianTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder).eval()
    torch.manual_seed(0)
    kwargs = {"do_sample": True, "top_k": 5} if sample else {"num_beams": 1, "do_sample": False}
    kwargs["max_new_tokens"] = 64
    with torch.no_grad():
        out = model.generate(**tok(texts, return_tensors="pt", padding=True), **kwargs)
    return tok.batch_decode(out, skip_special_tokens=True)


def test_every_change_is_a_table_substitution_in_place(standins):
    folder, texts, written = standins
    table = substitutions(SYNONYMS)
    distinct = sorted(set(texts))[:40]
    changed = 0
    for pair in ("en-zz", "zz-en"):
        info = written[pair]
        assert info["synonyms"] == "builtin" and info["words_with_substitutes"] > 10
        for word, subs in info["substitutions"].items():  # what the folder says it may do
            assert all(s.lower() in table[word.lower()] for s in subs), word
        saved = json.loads((folder / f"opus-mt-{pair}" / "pairforge-standin.json").read_text())
        assert saved["substitutions"] == info["substitutions"]
        for sample in (False, True):
            outs = _translate(folder / f"opus-mt-{pair}", distinct, sample)
            for src, out in zip(distinct, outs, strict=True):
                a, b = _words(src), _words(out)
                assert len(a) == len(b), (src, out)  # word order and count kept
                for x, y in zip(a, b, strict=True):
                    if x != y:
                        changed += 1
                        assert y.lower() in table.get(x.lower(), ()), (src, out, x, y)
    assert changed > 10  # it does vary its input


def test_antonyms_and_neighbours_are_never_substituted(standins):
    _, _, written = standins
    for info in written.values():
        for word in ("opened", "small", "breakfast", "morning", "late"):
            assert word not in info["substitutions"]
    # Nor by the table itself: no entry maps a word to its opposite.
    opposites = {("opened", "closed"), ("closed", "opened"), ("large", "small"), ("big", "small")}
    for word, subs in substitutions(SYNONYMS).items():
        assert not any((word, s) in opposites for s in subs)


def test_article_rule_and_a_custom_table(tmp_path):
    # "an expensive" must not become "an costly"; a verb has no article before it.
    table = substitutions({"expensive": ("costly", "pricey"), "began": ("started",)})
    assert table == {"began": ("started",)}
    tsv = tmp_path / "table.tsv"
    tsv.write_text("# mine\nlarge\tbig\tgreat\nquick\trapid\n", encoding="utf-8")
    assert load_table(str(tsv)) == {"large": ("big", "great"), "quick": ("rapid",)}
    assert load_table(None) == {}
    tsv.write_text("large big\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"table.tsv:1: expected word<TAB>substitute"):
        load_table(str(tsv))
    with pytest.raises(ConfigError, match="standin.synonyms: 'nowhere.tsv' is neither"):
        load_table("nowhere.tsv")
