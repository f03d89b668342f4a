"""The trained encoder as a sentence-transformers model folder.

Layout (``SentenceTransformer(path).encode`` loads it offline; so does ``AutoModel``):

- the encoder's ``config.json``/``model.safetensors`` and its tokenizer, at the root
  (``sentence_transformers.models.Transformer``), ``sentence_bert_config.json``;
- the pooling of the objective (``Objective.pooling``):
  ``cls_before_pooler`` -> ``Pooling`` with the CLS token; ``mean`` -> ``Pooling`` mean;
  ``cls`` -> ``Pooling`` CLS then ``Dense`` holding the encoder's pooler (Linear + Tanh);
  ``mask`` -> the tokenizer wraps each sentence in the prompt by itself (a template
  post-processor in ``tokenizer.json``: no sentence-transformers prompt can place text after the
  sentence), and ``pairforge_pooling.MaskPooling`` (a file in the folder) takes the state at the
  last [MASK]. Sentence-transformers runs code shipped in a model folder only when asked:
  ``SentenceTransformer(path, trust_remote_code=True)``;
- ``Normalize`` last when the start model had it (``normalize``), so the folder gives unit
  vectors as the start model did (the evaluator's encoder reads ``normalize`` and does the same);
- ``pairforge.json``: the objective, pooling, prompt, training step, dev score and provenance,
  which the evaluator reads;
- ``README.md``: the model card (``train/card.py``).

The folder is written under a temporary name, given the user's umask modes (safetensors writes
0600), and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from pairforge.pipeline.plumbing.errors import PairforgeError
from pairforge.pipeline.plumbing.files import apply_umask
from pairforge.pipeline.science.models import EXPORT_INFO
from pairforge.train.card import write_model_card
from pairforge.train.objectives.prompts import MASK_SLOT, SENTENCE_SLOT, check_template

POOLING_MODULE = "pairforge_pooling"
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
DENSE = "sentence_transformers.models.Dense"
NORMALIZE = "sentence_transformers.models.Normalize"


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _pooling_config(dim: int, cls: bool) -> dict[str, Any]:
    # The legacy keys load in every sentence-transformers release, 2.x to 6.x.
    return {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": cls,
        "pooling_mode_mean_tokens": not cls,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }


def _clear_call_state(tokenizer: Any) -> None:
    """Drop the padding and truncation that the tokenizer's last call left in its Rust backend.

    ``save_pretrained`` writes them into ``tokenizer.json``, so without this the file depends on
    what the process happened to tokenize last (training at ``max_length``, or the evaluator at
    another length after a resume). Every call sets them again, so nothing else changes.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()


def _special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a single sentence."""
    probe = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for k in range(len(full) - len(probe) + 1):
        if full[k : k + len(probe)] == probe:
            return full[:k], full[k + len(probe) :]
    raise PairforgeError(
        "export: cannot find where the tokenizer puts a sentence among its specials"
    )


def template_post_processor(tokenizer: Any, template: str):
    """A ``tokenizers`` post-processor that puts every sentence into ``template``.

    The template's text before and after ``[X]`` is tokenised once (``[MASK]`` as the mask
    token) and added around the sentence's tokens, inside the tokenizer's own special tokens.
    Returns (post-processor, number of tokens it adds).
    """
    from tokenizers.processors import TemplateProcessing

    check_template(template)
    head, tail = template.replace(MASK_SLOT, tokenizer.mask_token).split(SENTENCE_SLOT)
    before, after = _special_ends(tokenizer)
    pre = before + (tokenizer(head, add_special_tokens=False)["input_ids"] if head else [])
    post = (tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []) + after

    def token(name: str, ids: list[int]) -> dict[str, Any]:
        return {"id": name, "ids": ids, "tokens": tokenizer.convert_ids_to_tokens(ids)}

    pieces = [p for p, ids in (("<pre>", pre), ("$A:0", [0]), ("<post>", post)) if ids]
    specials = [token(n, ids) for n, ids in (("<pre>", pre), ("<post>", post)) if ids]
    return TemplateProcessing(single=" ".join(pieces), special_tokens=specials), len(pre) + len(
        post
    )


def _install_template(folder: Path, tokenizer: Any, template: str) -> int:
    """Make the saved tokenizer in ``folder`` wrap sentences in ``template``; returns the number
    of tokens the template adds (special tokens included)."""
    from tokenizers import Tokenizer

    processor, added = template_post_processor(tokenizer, template)
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.post_processor = processor
    backend.save(str(folder / "tokenizer.json"))
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    # Model-specific tokenizer classes rebuild their post-processor when loaded; the generic fast
    # tokenizer keeps the one in tokenizer.json.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    _write_json(config_file, config)
    return added


def export_model(
    folder: str | Path,
    encoder: Any,
    tokenizer: Any,
    pooling: str,
    prompt: str | None = None,
    max_sentence_tokens: int = 32,
    max_seq_length: int | None = None,
    info: dict[str, Any] | None = None,
    normalize: bool = False,
) -> Path:
    """Write ``encoder`` (a Hugging Face base model) as a sentence-transformers folder.

    ``max_seq_length``: the longest input the exported model reads (None: the tokenizer's
    model maximum, capped by the position embeddings). For ``mask`` pooling the sentence itself is
    cut at ``max_sentence_tokens`` tokens, as in training. ``normalize`` adds a ``Normalize``
    module last (unit-length vectors). Replaces ``folder`` if it exists.
    """
    folder = Path(folder)
    tmp = _fresh_temporary(folder)
    encoder.save_pretrained(tmp)
    _clear_call_state(tokenizer)
    tokenizer.save_pretrained(tmp)
    if max_seq_length is None:
        max_seq_length = _model_max_length(encoder.config, tokenizer)
    modules, added = _write_pooling(tmp, encoder, tokenizer, pooling, prompt)
    if added is not None:  # the template's tokens come on top of the cut sentence
        max_seq_length = max_sentence_tokens + added
    if normalize:
        modules.append(_write_normalize(tmp, len(modules)))
    _write_sentence_transformers_configs(tmp, modules, int(max_seq_length))
    _write_json(
        tmp / EXPORT_INFO,
        {
            **(info or {}),
            "pooling": pooling,
            "prompt": prompt,
            "max_sentence_tokens": max_sentence_tokens if pooling == "mask" else None,
            "max_seq_length": int(max_seq_length),
            "normalize": normalize,
            "trust_remote_code": pooling == "mask",
        },
    )
    write_model_card(tmp, path=str(folder))
    _move_into_place(tmp, folder)
    return folder


def _fresh_temporary(folder: Path) -> Path:
    """A new empty ``.<name>.tmp-<pid>`` beside ``folder``, once the temporaries of exports
    killed before their rename (whatever process wrote them) are gone."""
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    return tmp


def _model_max_length(config: Any, tokenizer: Any) -> int:
    """The tokenizer's model maximum, capped by the position embeddings (512 when the config
    does not say)."""
    positions = getattr(config, "max_position_embeddings", None) or 512
    return min(int(tokenizer.model_max_length), int(positions))


def _write_pooling(
    tmp: Path, encoder: Any, tokenizer: Any, pooling: str, prompt: str | None
) -> tuple[list[dict[str, Any]], int | None]:
    """Write the pooling modules' folders into ``tmp``; returns the ``modules.json`` entries
    (the Transformer first, then the pooling) and, for ``mask`` pooling, the number of tokens
    the prompt template adds (None otherwise). PairforgeError for an unknown pooling, or
    ``mask`` without ``prompt``."""
    dim = int(encoder.config.hidden_size)
    modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER}]
    if pooling in ("cls_before_pooler", "mean", "cls"):
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING})
        _write_json(tmp / "1_Pooling" / "config.json", _pooling_config(dim, pooling != "mean"))
        if pooling == "cls":
            _write_dense_pooler(tmp / "2_Dense", encoder)
            modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": DENSE})
        return modules, None
    if pooling == "mask":
        if prompt is None:
            raise PairforgeError("export: mask pooling needs the prompt template")
        added = _install_template(tmp, tokenizer, prompt)
        modules.append(_write_mask_pooling(tmp, tokenizer, dim))
        return modules, added
    raise PairforgeError(f"export: unknown pooling {pooling!r}")


def _write_mask_pooling(tmp: Path, tokenizer: Any, dim: int) -> dict[str, Any]:
    """Put ``MaskPooling`` (its module file and ``1_MaskPooling/config.json``) into ``tmp``;
    returns its ``modules.json`` entry."""
    shutil.copyfile(Path(__file__).with_name("st_pooling.py"), tmp / f"{POOLING_MODULE}.py")
    _write_json(
        tmp / "1_MaskPooling" / "config.json",
        {"mask_token_id": int(tokenizer.mask_token_id), "embedding_dimension": dim},
    )
    return {"idx": 1, "name": "1", "path": "1_MaskPooling", "type": f"{POOLING_MODULE}.MaskPooling"}


def _write_normalize(tmp: Path, index: int) -> dict[str, Any]:
    """The ``Normalize`` module's (empty) folder in ``tmp``; returns its ``modules.json`` entry
    at position ``index``."""
    path = f"{index}_Normalize"
    (tmp / path).mkdir()
    return {"idx": index, "name": str(index), "path": path, "type": NORMALIZE}


def _write_sentence_transformers_configs(
    tmp: Path, modules: list[dict[str, Any]], max_seq_length: int
) -> None:
    """``modules.json``, ``sentence_bert_config.json`` and ``config_sentence_transformers.json``
    (cosine similarity, no prompts)."""
    _write_json(tmp / "modules.json", modules)
    _write_json(
        tmp / "sentence_bert_config.json",
        {"max_seq_length": max_seq_length, "do_lower_case": False},
    )
    _write_json(
        tmp / "config_sentence_transformers.json",
        {
            "__version__": {"pytorch": torch.__version__},
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )


def _move_into_place(tmp: Path, folder: Path) -> None:
    """Give ``tmp`` the user's umask modes (safetensors writes 0600) and rename it to
    ``folder``, replacing what was there."""
    apply_umask(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def _write_dense_pooler(folder: Path, encoder: Any) -> None:
    from safetensors.torch import save_file

    pooler = getattr(encoder, "pooler", None)
    dense = getattr(pooler, "dense", None)
    if dense is None:
        raise PairforgeError("export: cls pooling needs the encoder's pooler, and it has none")
    _write_json(
        folder / "config.json",
        {
            "in_features": dense.in_features,
            "out_features": dense.out_features,
            "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh",
        },
    )
    save_file(
        {
            "linear.weight": dense.weight.detach().cpu().contiguous(),
            "linear.bias": dense.bias.detach().cpu().contiguous(),
        },
        str(folder / "model.safetensors"),
    )
