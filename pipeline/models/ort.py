"""The ``onnxruntime`` engine of the encoder: a BERT-family encoder exported once to ONNX
(float32, token states and the pooler's output), then quantised with ONNX Runtime's dynamic
quantisation at ``compute_type`` ``int8`` (int8 weights per output channel, activations
quantised per tensor at run time; ``float32`` runs the export as it is). Both are cached under
``models_dir`` by model, revision and compute type, as the CTranslate2 conversions are
(``pipeline.modelfiles``), the int8 model made from the cached float32 export. Its token states
go through the same ``pooling.pool`` as the torch engine's, so every pooling means the same thing
on both. It runs on CPU (the ``onnxruntime`` package has no GPU provider) and has no training
mode: dropout views need torch. Measured against the torch engine in docs/mine.md
(benchmarks/embed_int8.py).

Which MatMuls int8 leaves in float32 (``float32_layers``): ``ffn_output`` (the default) the FFN
output projections, the down-projections from the intermediate size to the hidden size, where
GELU's outliers make a per-tensor activation scale coarse; ``ffn`` both FFN projections; ``none``
quantises every weight MatMul. Found by weight shape, so the rule holds for every architecture
exported here; docs/mine.md measures the three.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
from pairforge.pipeline.errors import ConfigError

log = logging.getLogger("pairforge")

COMPUTE_TYPES: tuple[str, ...] = ("int8", "float32")
Float32Layers = Literal["none", "ffn_output", "ffn"]
FLOAT32_LAYERS: tuple[str, ...] = ("none", "ffn_output", "ffn")
# The encoders whose transformers classes export with token states and an optional pooler, and
# whose inputs are the tokenizer's (input_ids, attention_mask[, token_type_ids]).
MODEL_TYPES: tuple[str, ...] = ("bert", "distilbert", "roberta", "xlm-roberta", "electra")
OPSET = 17
MODEL_FILE = "model.onnx"


class ORTModel:
    """An ``onnxruntime.InferenceSession`` called like a transformers encoder (for
    ``SentenceEncoder``)."""

    training = False

    def __init__(self, session: Any) -> None:
        self.session = session
        self.inputs = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]

    def __call__(
        self,
        input_ids: Any,
        attention_mask: Any,
        token_type_ids: Any = None,
        return_dict: bool = True,
    ) -> SimpleNamespace:
        """The encoder's output for a padded torch batch, as float32 torch tensors shaped like
        transformers' (``last_hidden_state`` ``(b, seq, d)``, ``pooler_output`` ``(b, d)`` or
        None), for ``pool``."""
        import torch

        ids = input_ids.numpy().astype(np.int64)  # (b, seq)
        feed = {"input_ids": ids, "attention_mask": attention_mask.numpy().astype(np.int64)}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = (
                token_type_ids.numpy().astype(np.int64)
                if token_type_ids is not None
                else np.zeros_like(ids)
            )
        found = dict(zip(self.outputs, self.session.run(self.outputs, feed), strict=True))
        pooled = found.get("pooler_output")
        return SimpleNamespace(
            last_hidden_state=torch.from_numpy(found["last_hidden_state"]),
            pooler_output=torch.from_numpy(pooled) if pooled is not None else None,
        )


def load_onnxruntime(
    spec: str,
    device: str,
    compute_type: str,
    models_dir: str,
    threads: int,
    float32_layers: Float32Layers = "ffn_output",
) -> tuple[Any, ORTModel, int]:
    """(tokenizer, :class:`ORTModel`, dim) of a model spec, exported (and quantised) on first
    use and loaded from ``models_dir`` after. ``threads`` > 0 sets ONNX Runtime's intra-op
    threads (else its default, one per core). A ConfigError names the spec when the model
    cannot be found or exported, or the settings do not apply."""
    import onnxruntime as ort
    from pairforge.pipeline.modelfiles import resolve_translation_model
    from transformers import AutoConfig, AutoTokenizer

    if compute_type not in COMPUTE_TYPES:
        raise ConfigError(
            f"compute_type {compute_type!r} is not available for the onnxruntime engine: "
            f"allowed {', '.join(COMPUTE_TYPES)}"
        )
    if float32_layers not in FLOAT32_LAYERS:
        raise ConfigError(f"float32_layers {float32_layers!r}: allowed {', '.join(FLOAT32_LAYERS)}")
    if device != "cpu":
        raise ConfigError(
            f"device {device!r}: the onnxruntime engine runs on cpu (set device: cpu, or use "
            "engine transformers on a GPU)"
        )
    ref = resolve_translation_model(spec)
    config = AutoConfig.from_pretrained(ref.path)
    if config.model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model {spec!r}: the onnxruntime engine exports BERT-family encoders "
            f"({', '.join(MODEL_TYPES)}), not model_type {config.model_type!r}: use engine "
            "transformers"
        )
    tokenizer = AutoTokenizer.from_pretrained(ref.path)
    folder, _ = convert_onnx(ref, compute_type, models_dir, float32_layers)
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(threads, 0)  # 0: ONNX Runtime's default
    options.inter_op_num_threads = 1
    # As torch's OMP_WAIT_POLICY=PASSIVE (encoder.load_text_encoder): spinning idle threads
    # cost the other jobs of a shared CPU more than they save this one.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its graph-fusion notes are not the user's
    session = ort.InferenceSession(
        str(folder / MODEL_FILE), options, providers=["CPUExecutionProvider"]
    )
    return tokenizer, ORTModel(session), int(config.hidden_size)


def convert_onnx(
    ref: Any, compute_type: str, models_dir: str, float32_layers: Float32Layers = "ffn_output"
) -> tuple[Path, bool]:
    """The ONNX model of ``ref`` (a ``modelfiles.ModelRef``) at ``compute_type``:
    ``(folder, made now)``.

    Made once per (model, revision, compute type, float32 layers) and reused by every later run;
    int8 is quantised from the float32 export, itself made once. A lock keeps concurrent workers
    from making it twice, and the folder appears only when complete.
    """
    from pairforge.pipeline.modelfiles import made_once

    name = "onnx-float32" if compute_type == "float32" else f"onnx-int8-{float32_layers}"
    source = None
    if compute_type == "int8":
        source, _ = convert_onnx(ref, "float32", models_dir)  # outside this folder's lock

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        if source is None:
            log.info("exporting %s to ONNX (float32), once, into %s", ref.spec, models_dir)
            _export(ref, tmp / MODEL_FILE)
        else:
            log.info("quantising %s's ONNX export to int8 (%s in float32), once, into %s",
                     ref.spec, float32_layers, models_dir)  # fmt: skip
            _quantize(source / MODEL_FILE, tmp / MODEL_FILE, float32_layers)

    record = {"spec": ref.spec, "revision": ref.revision, "compute_type": compute_type}
    if source is not None:
        record["float32_layers"] = float32_layers
    what = "ONNX export" if source is None else "ONNX quantisation"
    return made_once(ref, name, models_dir, MODEL_FILE, build, what, record)


def _wrapper(model: Any, token_types: bool) -> Any:
    """The encoder's forward as ONNX sees it: tensors in, (token states[, pooler output]) out."""
    import torch

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            extra = {"token_type_ids": token_type_ids} if token_types else {}
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra
            )
            pooled = getattr(out, "pooler_output", None)
            if pooled is None:
                return (out.last_hidden_state,)
            return out.last_hidden_state, pooled

    return Outputs()


def _export(ref: Any, path: Path) -> None:
    """The float32 encoder of ``ref`` written to ``path`` as ONNX, batch and sequence dynamic.

    The TorchScript exporter (``dynamo=False``) needs only the ``onnx`` package. The model is
    traced in eager attention on a batch with padding, so the graph keeps the attention mask
    (a batch without padding would let transformers drop it) and holds plain MatMul/Softmax.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(ref.path, attn_implementation="eager").float().eval()
    tokenizer = AutoTokenizer.from_pretrained(ref.path)
    batch = tokenizer(
        ["a sentence", "a somewhat longer sentence to pad the first one"],
        padding=True,
        return_tensors="pt",
    )
    token_types = "token_type_ids" in batch and (
        "token_type_ids" in model.forward.__code__.co_varnames
    )
    inputs = ["input_ids", "attention_mask", *(["token_type_ids"] if token_types else [])]
    wrapped = _wrapper(model, token_types)
    with torch.no_grad():
        probe = wrapped(*(batch[k] for k in inputs))
    outputs = ["last_hidden_state", "pooler_output"][: len(probe)]
    axes = {k: {0: "batch", 1: "sequence"} for k in (*inputs, "last_hidden_state")}
    axes["pooler_output"] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shapes it keeps dynamic
        torch.onnx.export(
            wrapped,
            tuple(batch[k] for k in inputs),
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes={k: v for k, v in axes.items() if k in (*inputs, *outputs)},
            opset_version=OPSET,
            dynamo=False,
        )


def float32_matmuls(path: Path, float32_layers: Float32Layers) -> list[str]:
    """The names of the weight MatMuls of the ONNX model at ``path`` that ``float32_layers``
    keeps in float32: FFN output projections have a weight of shape (intermediate, hidden), wider
    in than out; FFN input projections the reverse. Attention and pooler weights are square."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    names = []
    for node in graph.node:
        shape = shapes.get(node.input[1]) if node.op_type == "MatMul" else None
        if shape is None or len(shape) != 2:
            continue
        down, up = shape[0] > shape[1], shape[0] < shape[1]
        if (float32_layers in ("ffn_output", "ffn") and down) or (float32_layers == "ffn" and up):
            names.append(node.name)
    return names


def _quantize(source: Path, path: Path, float32_layers: Float32Layers) -> None:
    """``quantize_dynamic`` of the float32 model at ``source`` into ``path``: int8 weights per
    output channel, the weight MatMuls only (embeddings and activation-by-activation products
    stay float32), ``float32_layers`` excluded."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded = float32_matmuls(source, float32_layers)
    with warnings.catch_warnings(), _quiet_root_logger():
        warnings.simplefilter("ignore")
        quantize_dynamic(
            str(source),
            str(path),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=excluded,
        )


@contextlib.contextmanager
def _quiet_root_logger():
    """ONNX Runtime's quantiser advises pre-processing (symbolic shapes, graph optimisation)
    through ``logging.warning``, on the root logger, which that call also configures when it has
    no handler. Not taken: docs/mine.md measures the export quantised as it is; and the user's
    logging is not this module's to configure."""
    root = logging.getLogger()
    null = logging.NullHandler()

    def keep(record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname

    root.addHandler(null)
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
        root.removeHandler(null)
