"""The model card (``README.md``) of an exported encoder, in the sentence-transformers style.

YAML front matter the Hub reads (``library_name``, ``pipeline_tag``, ``tags``, ``base_model``,
``license`` as a Hub identifier, ``language``), then what the model is, how it was trained (the
objective, its resolved recipe, the training data with a link to the pairs dataset's card, the
best checkpoint's step out of the steps run), its dev scores, where its STS test table is, and
how to load it with sentence-transformers or plain transformers.

``export_model`` writes the card of a checkpoint; the trainer writes it again once the run is
over (``write_model_card`` with ``run``), when the number of steps run and the dev curve are
known. The card is rendered from the folder's ``pairforge.json`` only, so it can be rewritten
any time without the model in memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pairforge.pipeline.plumbing.files import atomic_write_bytes
from pairforge.pipeline.science.models import EXPORT_INFO, hub_id, model_label, resolve_model
from pairforge.pipeline.science.sts import LABELS

CARD = "README.md"
UNKNOWN_LICENSE = "unknown"  # a Hub licence identifier: the base model's licence was not found

OBJECTIVE_PAPERS = {
    "simcse": "SimCSE (Gao et al., EMNLP 2021)",
    "simcse_hn": "SimCSE (Gao et al., EMNLP 2021) with mined hard negatives",
    "simcse_bt": "SimCSE (Gao et al., EMNLP 2021) with a back-translation as the positive",
    "debcse": "DebCSE (Miao et al., CIKM 2023)",
    "denosent": "DenoSent (Wang and Dou, AAAI 2024)",
    "bsl": "BSL (Zhang et al., ACL 2021)",
    "infocse": "InfoCSE (Wu et al., EMNLP Findings 2022)",
    "cotbert": "CoT-BERT (Zhang et al., 2023)",
    "combined": "DenoSent's denoising objective with DebCSE's contrastive one",
}
POOLING_WORDS = {
    "cls_before_pooler": "the [CLS] token's last hidden state",
    "cls": "the [CLS] token through the encoder's pooler (Linear + Tanh)",
    "mean": "the mean of the token states",
    "mask": "the last [MASK] token's state, the sentence wrapped in a prompt",
}
# The settings the card's recipe table shows, in this order: what a reader needs to reproduce
# the run (the recipe's keys without the dev-evaluation ones, plus precision and seed). A choice
# of display, not a declaration: the keys and their defaults are train's config
# (stages/train/stage.py); every setting of the run is in pairforge.json.
CARD_SETTINGS = (
    "batch_size",
    "lr",
    "weight_decay",
    "schedule",
    "warmup_steps",
    "warmup_ratio",
    "max_steps",
    "epochs",
    "max_length",
    "max_grad_norm",
    "precision",
    "seed",
)


def base_model_metadata(spec: str | None) -> dict[str, Any]:
    """The base model's card front matter (its ``license`` above all), when its folder has one."""
    if not spec:
        return {}
    try:
        folder = Path(resolve_model(spec))
    except Exception:  # a spec that no longer resolves: the card says "unknown"
        return {}
    return read_front_matter(folder / CARD) if folder.is_dir() else {}


def read_front_matter(path: Path) -> dict[str, Any]:
    """The YAML between the leading ``---`` lines of a card; empty when it has none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    if not text.startswith("---"):
        return {}
    head, sep, _ = text[3:].partition("\n---")
    if not sep:
        return {}
    try:
        meta = yaml.safe_load(head)
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value, sort_keys=True)}`"
    return f"`{value}`" if isinstance(value, str) else str(value)


def _dev_table(dev_history: list[dict[str, Any]], best_step: int | None) -> list[str]:
    tasks = [k for k in dev_history[0] if k in LABELS]
    head = ["step", "mean", *(LABELS[t] for t in tasks)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in dev_history:
        step = f"**{d['step']}** (kept)" if d["step"] == best_step else str(d["step"])
        cells = [step, f"{d['score']:.2f}", *(f"{d[t]:.2f}" for t in tasks)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _transformers_snippet(path: str, info: dict[str, Any]) -> list[str]:
    pooling = info.get("pooling")
    lines = [
        "import torch",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(path)})",
        f"model = AutoModel.from_pretrained({json.dumps(path)}).eval()",
        'batch = tokenizer(["A sentence.", "Another one."], padding=True, truncation=True,',
        f"                  max_length={int(info.get('max_seq_length') or 128)}, "
        'return_tensors="pt")',
        "with torch.no_grad():",
        "    out = model(**batch)",
    ]
    if pooling == "mean":
        lines += [
            'mask = batch["attention_mask"].unsqueeze(-1).float()',
            "vectors = (out.last_hidden_state * mask).sum(1) / mask.sum(1)",
        ]
    elif pooling == "cls":
        lines += ["vectors = out.pooler_output  # [CLS] through the pooler"]
    elif pooling == "mask":
        lines += [
            "# The tokenizer wraps each sentence in the prompt; the vector is the last [MASK].",
            'is_mask = batch["input_ids"] == tokenizer.mask_token_id',
            "positions = torch.arange(is_mask.shape[1]).expand_as(is_mask)",
            "last = torch.where(is_mask, positions, -1).max(1).values",
            "vectors = out.last_hidden_state[torch.arange(len(last)), last]",
        ]
    else:
        lines += ["vectors = out.last_hidden_state[:, 0]  # the [CLS] state"]
    if info.get("normalize"):
        lines += ["vectors = torch.nn.functional.normalize(vectors, dim=-1)"]
    return lines


def model_card(
    info: dict[str, Any],
    path: str,
    run: dict[str, Any] | None = None,
    dim: int | None = None,
    data_card: str | None = None,
) -> str:
    """The card's text for an export described by ``info`` (its ``pairforge.json``).

    ``path``: the folder as the load snippets name it. ``run``: what the finished run knows
    (``steps`` run, ``dev_history``, ``best``); without it the card describes a checkpoint.
    ``dim``: the vector size. ``data_card``: a link to the pairs dataset's card.
    """
    run = run or {}
    objective = info.get("objective") or "unknown"
    license_id = str(base_model_metadata(info.get("base_model")).get("license") or UNKNOWN_LICENSE)
    lines = [
        *_card_head(info, objective, license_id, dim),
        *_details_section(info, objective, license_id, dim),
        *_training_section(info, run),
        *_data_section(info.get("data") or {}, data_card),
        *_recipe_section(info, objective),
        *_evaluation_section(info, run),
        *_usage_section(info, path),
        *FILES_SECTION,
    ]
    return "\n".join(lines)


def _front_matter(
    objective: str, license_id: str, base_id: str | None, data: dict[str, Any]
) -> str:
    """The card's YAML front matter (without its ``---`` lines): the Hub's library, pipeline
    tag and tags, the licence identifier, and the base model and dataset Hub ids when known."""
    meta: dict[str, Any] = {
        "language": ["en"],
        "license": license_id,
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": [
            "sentence-transformers",
            "sentence-similarity",
            "feature-extraction",
            "pairforge",
            objective,
        ],
    }
    if base_id:
        meta["base_model"] = base_id
    if data.get("hub_id"):
        meta["datasets"] = [data["hub_id"]]
    return yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()


def _card_head(info: dict[str, Any], objective: str, license_id: str, dim: int | None) -> list[str]:
    """The card's first lines: the front matter between ``---`` lines, the title and the
    paragraph saying what the model is, by which objective and from which base model."""
    base = info.get("base_model")
    base_id = hub_id(base) if base else None
    front = _front_matter(objective, license_id, base_id, info.get("data") or {})
    summary = (
        "A [sentence-transformers](https://www.sbert.net) model that maps sentences to "
        + (f"{dim}-dimensional " if dim else "")
        + f"vectors for semantic similarity, search and clustering. It was trained with "
        f"{OBJECTIVE_PAPERS.get(objective, f'the `{objective}` objective')} by "
        f"pairforge on pairs mined from unlabelled sentences, starting "
        f"from `{base}`"
        + (f" ([{base_id}](https://huggingface.co/{base_id}))" if base_id else "")
        + "."
    )
    title = f"{objective} sentence encoder from {model_label(base)}"
    return ["---", front, "---", "", f"# {title}", "", summary, ""]


def _details_section(
    info: dict[str, Any], objective: str, license_id: str, dim: int | None
) -> list[str]:
    """The "Model details" table: base model, objective, pooling (and prompt), sequence length,
    output size, similarity, whether vectors are unit length, licence."""
    pooling = info.get("pooling")
    lines = [
        "## Model details",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{info.get('base_model')}` |",
        f"| objective | `{objective}` |",
        f"| pooling | `{pooling}`: {POOLING_WORDS.get(pooling or '', '')} |",
    ]
    if info.get("prompt"):
        lines.append(f"| prompt | `{info['prompt']}` |")
    return [
        *lines,
        f"| max sequence length | {info.get('max_seq_length', '-')} tokens |",
        *([f"| output dimension | {dim} |"] if dim else []),
        "| similarity | cosine |",
        f"| unit-length vectors | {'yes' if info.get('normalize') else 'no'} |",
        f"| licence | `{license_id}` (the base model's) |",
        "",
    ]


def _training_section(info: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """The "Training" section: the steps run and the kept step once the run is over (``run``
    has ``steps``), else the checkpoint's own step and dev score; nothing claimed beyond that."""
    steps = run.get("steps")
    best = run.get("best") or {}
    dev = info.get("dev") or {}
    if steps is None:
        said = (
            f"The checkpoint at step {info.get('step')}"
            + (f", mean dev Spearman {dev['score']:.2f}" if dev.get("score") is not None else "")
            + "."
        )
    elif best.get("step") is not None:
        said = (
            f"Trained for {steps} optimiser steps; this folder is the checkpoint at step "
            f"{best['step']}, the best mean dev Spearman ({best['score']:.2f})."
        )
    else:
        said = f"Trained for {steps} optimiser steps (no dev evaluation ran)."
    return ["## Training", "", said, ""]


def _data_section(data: dict[str, Any], data_card: str | None) -> list[str]:
    """The "Data" section: the pairs dataset's path and anchor count (``data`` is
    ``info["data"]``), with the link to its card when there is one."""
    if not data.get("path"):
        return ["### Data", "", "The training data is recorded in `pairforge.json`.", ""]
    rows = f"{data['rows']:,} anchors" if data.get("rows") is not None else "the anchors"
    link = (
        f"; how it was made, its columns and figures are in [its card]({data_card})"
        if data_card
        else ""
    )
    said = (
        f"The pairs dataset `{data['path']}`: {rows}, each with its mined positives and hard "
        "negatives" + link + "."
    )
    return ["### Data", "", said, ""]


def _recipe_section(info: dict[str, Any], objective: str) -> list[str]:
    """The "Objective and recipe" table: the objective's options (sorted, ``objective.key``),
    then the run's :data:`CARD_SETTINGS` that ``info["settings"]`` holds, in that order."""
    settings = info.get("settings") or {}
    options = sorted((info.get("options") or {}).items())
    return [
        "### Objective and recipe",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| `{objective}.{key}` | {_cell(value)} |" for key, value in options),
        *(f"| {key} | {_cell(settings[key])} |" for key in CARD_SETTINGS if key in settings),
        "",
        "Every setting of the run is in `pairforge.json`.",
        "",
    ]


def _evaluation_section(info: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """The "Evaluation" section: the dev curve with the kept step when ``run`` has one, else the
    checkpoint's dev score when known; then where the STS test table is written."""
    settings = info.get("settings") or {}
    dev = info.get("dev") or {}
    dev_history = run.get("dev_history") or []
    lines = ["## Evaluation", ""]
    if dev_history:
        sampled = (
            f" ({settings['eval_max_pairs']} pairs sampled from each)"
            if settings.get("eval_max_pairs")
            else ""
        )
        lines += [
            "Spearman correlation x100 of cosine similarity with the gold scores on the dev "
            "sets" + sampled + ", during training:",
            "",
            *_dev_table(dev_history, (run.get("best") or {}).get("step")),
            "",
        ]
    elif dev.get("score") is not None:
        lines += [f"Mean dev Spearman x100 at step {info.get('step')}: {dev['score']:.2f}.", ""]
    return [
        *lines,
        "The STS test table (STS12-16, STS-B, SICK-R, Spearman x100), beside the base model, is "
        "written by `pairforge evaluate` to `reports/evaluate.md` of the run that made this model "
        "(the evaluation reads this folder; it does not change it).",
        "",
    ]


def _usage_section(info: dict[str, Any], path: str) -> list[str]:
    """The "Usage" section: loading ``path`` with sentence-transformers (``trust_remote_code``
    and its warning for the [MASK] pooling), then with transformers alone; both snippets run
    as written and give the evaluator's vectors."""
    trust = info.get("pooling") == "mask"
    load_args = f"{json.dumps(path)}, trust_remote_code=True" if trust else json.dumps(path)
    lines = [
        "## Usage",
        "",
        "With sentence-transformers:",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        f"model = SentenceTransformer({load_args})",
        'embeddings = model.encode(["A sentence.", "Another one."])',
        "similarities = model.similarity(embeddings, embeddings)",
        "```",
        "",
    ]
    if trust:
        lines += [
            "`trust_remote_code=True` runs `pairforge_pooling.py` from this folder (the [MASK] "
            "pooling); read it first.",
            "",
        ]
    return [
        *lines,
        "With transformers only:",
        "",
        "```python",
        *_transformers_snippet(path, info),
        "```",
        "",
    ]


# The card's last section: what the folder holds, the same for every export.
FILES_SECTION = (
    "## Files",
    "",
    "- `pairforge.json`: the objective, pooling, every training setting, the dev score and "
    "provenance (`pairforge evaluate` reads it).",
    "- the encoder and tokenizer at the root, the sentence-transformers modules "
    "(`modules.json`) beside them.",
    "",
)


def write_model_card(
    folder: str | Path,
    run: dict[str, Any] | None = None,
    path: str | None = None,
) -> Path:
    """(Re)write ``folder/README.md`` from ``folder/pairforge.json``; returns the card's path.

    ``path``: how the load snippets name the folder (default: ``folder`` as given).
    """
    folder = Path(folder)
    info = json.loads((folder / EXPORT_INFO).read_text())
    dim = None
    config = folder / "config.json"
    if config.exists():
        dim = json.loads(config.read_text()).get("hidden_size")
    data = (info.get("data") or {}).get("path")
    link = dataset_card_link(data, Path(path) if path else folder) if data else None
    text = model_card(info, path or str(folder), run, dim, link)
    card = folder / CARD
    atomic_write_bytes(card, text.encode(), durable=False)
    return card


def dataset_card_link(data: str | Path, model_folder: str | Path) -> str | None:
    """A relative link from the model folder to the pairs dataset's card, when it has one."""
    # The sample stage's card: ``_README.md`` beside the shards, or ``README.md`` once renamed
    # for the Hub (pipeline/science/dataset_card.py).
    for name in ("_README.md", CARD):
        card = Path(data) / name
        if card.exists():
            return os.path.relpath(card, Path(model_folder))
    return None
