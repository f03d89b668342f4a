"""The training data stream (seeded shuffle buffer over Parquet shards) and the collator."""

from __future__ import annotations

import io

import pytest
import torch
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import IncompleteDatasetError, PairforgeError
from pairforge.train.data import Collator, PairsSource, RowStream
from pairforge.train.objectives.debcse import DebCSE
from pairforge.train.objectives.denosent import DenoSent

from tests.train.builders import write_pairs


def numbered(n: int) -> dict[str, list]:
    return {
        S.TEXT: [f"sentence {i}" for i in range(n)],
        S.VIEW1_TEXT: [f"view {i}" for i in range(n)],
    }


@pytest.fixture
def fifty(tmp_path):
    # 4 shards of 16, 16, 16, 2 rows; row groups of 5 rows, so chunks cross group boundaries.
    return write_pairs(tmp_path / "pairs", numbered(50), rows_per_shard=16, row_group_size=5)


def stream(path, seed=7, buffer_size=8, read_rows=3):
    source = PairsSource(path).select([S.TEXT])
    return RowStream(source, buffer_size=buffer_size, seed=seed, read_rows=read_rows)


def test_each_epoch_visits_every_row_once_in_a_seeded_order(fifty):
    s = stream(fifty)
    first = [r[0] for r in s.take(50)]
    assert sorted(first) == sorted(f"sentence {i}" for i in range(50))
    assert first != sorted(first, key=lambda t: int(t.split()[1]))  # shuffled
    second = [r[0] for r in s.take(50)]
    assert sorted(second) == sorted(first) and second != first and s.epoch == 1
    assert [r[0] for r in stream(fifty).take(50)] == first
    assert [r[0] for r in stream(fifty, seed=8).take(50)] != first
    assert s.rows_read == 100 and s.rows_used == 100


def test_a_restored_stream_continues_exactly(fifty):
    a = stream(fifty)
    a.take(23)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)  # as the checkpoint stores it
    buffer.seek(0)
    b = stream(fifty)
    b.load_state_dict(torch.load(buffer, weights_only=False))
    assert b.take(60) == a.take(60)
    c = stream(fifty, buffer_size=9)
    with pytest.raises(ValueError, match="stream state is for"):
        c.load_state_dict(a.state_dict())


def test_buffer_holds_at_most_buffer_size_plus_a_chunk(fifty):
    s = stream(fifty, buffer_size=8, read_rows=3)
    for _ in range(20):
        s.take(1)
        assert len(s.buffer) <= 8 + 3


def test_unusable_rows_are_skipped_and_counted(tmp_path):
    columns = {
        S.TEXT: ["good one", None, "   ", "good two", "good three"],
        S.NEGATIVE_TEXTS: [["x"], ["y"], ["z"], [], ["", " "]],
    }
    path = write_pairs(tmp_path / "p", columns, rows_per_shard=2)
    source = PairsSource(path).select([S.TEXT, S.NEGATIVE_TEXTS])
    s = RowStream(source, buffer_size=10, seed=0)
    assert s.take(1) == [("good one", ["x"])]
    assert dict(s.skipped) == {f"empty:{S.TEXT}": 2, f"empty:{S.NEGATIVE_TEXTS}": 2}
    empty = write_pairs(tmp_path / "e", {S.TEXT: ["", None]})
    with pytest.raises(PairforgeError, match=r"no usable row .* \(empty:text 2\)"):
        RowStream(PairsSource(empty).select([S.TEXT])).take(1)


def test_source_errors_name_the_dataset_and_the_columns(tmp_path, fifty):
    with pytest.raises(PairforgeError, match=r"has no text column\(s\) \['negative_texts'\]"):
        PairsSource(fifty).select([S.TEXT, S.NEGATIVE_TEXTS])
    assert PairsSource(fifty).available == [S.TEXT, S.VIEW1_TEXT]
    with pytest.raises(IncompleteDatasetError, match="the folder does not exist"):
        PairsSource(tmp_path / "nowhere")


def test_collator_shapes_list_columns_and_draws_one_positive(tiny_tokenizer):
    objective = DebCSE(32)
    rows = [
        (
            "the cat sat .",
            ["the cat .", "cat sat ."],
            ["a dog ran .", "birds fly .", "rain falls ."],
        ),
        ("a dog ran .", ["dog ran .", "a dog ."], ["the sun rises ."]),
        ("birds fly .", ["birds .", "fly ."], ["the cat sat .", "a dog ran ."]),
        ("rain falls .", ["rain .", "falls ."], ["birds fly .", "the cat ."]),
    ]
    columns = [S.TEXT, S.POSITIVE_TEXTS, S.NEGATIVE_TEXTS]
    kinds = {S.TEXT: "text", S.POSITIVE_TEXTS: "list", S.NEGATIVE_TEXTS: "list"}
    collate = Collator(objective, tiny_tokenizer, columns, kinds, max_length=8, seed=1)
    batch = collate(rows, step=0)
    assert batch[S.TEXT]["input_ids"].shape[0] == 4
    negatives = batch[S.NEGATIVE_TEXTS]["input_ids"]
    assert negatives.shape[:2] == (4, 3)  # the longest list; shorter rows cycle their own

    def decode(ids, skip_special_tokens=True):
        tokens = tiny_tokenizer.convert_ids_to_tokens(ids)
        return " ".join(t for t in tokens if t not in tiny_tokenizer.all_special_tokens)

    assert [decode(negatives[1, k], skip_special_tokens=True) for k in range(3)] == [
        "the sun rises ."
    ] * 3
    assert decode(negatives[2, 2], skip_special_tokens=True) == "the cat sat ."
    positives = batch[S.POSITIVE_TEXTS]["input_ids"]
    assert positives.shape[0] == 4 and positives.dim() == 2
    picked = [decode(positives[i], skip_special_tokens=True) for i in range(4)]
    assert all(p in rows[i][1] for i, p in enumerate(picked))
    assert collate(rows, step=0)[S.POSITIVE_TEXTS]["input_ids"].equal(positives)  # seeded by step
    draws = {
        tuple(
            decode(collate(rows, step)[S.POSITIVE_TEXTS]["input_ids"][i], skip_special_tokens=True)
            for i in range(4)
        )
        for step in range(8)
    }
    assert len(draws) > 1
    # A rank's slice gets the same draws as the whole batch.
    half = collate(rows, step=0, part=slice(2, 4))
    assert [
        decode(half[S.POSITIVE_TEXTS]["input_ids"][i], skip_special_tokens=True) for i in range(2)
    ] == picked[2:]
    assert half[S.NEGATIVE_TEXTS]["input_ids"].shape[:2] == (2, 3)


def test_collator_uses_the_objective_prompt(tiny_tokenizer):
    objective = DenoSent(
        32, tiny_tokenizer.mask_token_id, 0, vocab_size=len(tiny_tokenizer), num_decoder_layers=1
    )
    collate = Collator(objective, tiny_tokenizer, [S.TEXT], {S.TEXT: "text"}, max_length=2)
    ids = collate([("the cat sat .",)], step=0)[S.TEXT]["input_ids"][0]
    tokens = tiny_tokenizer.convert_ids_to_tokens(ids)
    assert tokens == ["[CLS]", '"', "the", "cat", '"', "means", "[MASK]", ".", "[SEP]"]
