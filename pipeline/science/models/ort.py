"""The ``onnxruntime`` engine of the encoder: a BERT-family encoder exported once to ONNX
(float32, token states and the pooler's output), then quantised with ONNX Runtime's dynamic
quantisation at ``compute_type`` ``int8`` (8-bit weights per output channel, activations
quantised per tensor at run time; ``float32`` runs the export as it is). Both are cached under
``models_dir`` by model, revision, compute type and int8 recipe, as the CTranslate2 conversions are
(``pipeline.science.models.files``), the int8 model made from the cached float32 export. Its token states
go through the same ``pooling.pool`` as the torch engine's, so every pooling means the same thing
on both. It runs on CPU (the ``onnxruntime`` package has no GPU provider) and has no training
mode: dropout views need torch. benchmarks/embed_int8.py measures it against the torch engine
(docs/mine.md, "Engines: int8 on the CPU").

How int8 is made (each choice is part of the cached model's name and record; the records that
chose them are linked from docs/mine.md):

- ``smooth`` (SmoothQuant, Xiao et al. 2023; default alpha 0.8): a BERT's hidden states carry a
  few channels tens of times larger than the rest, which a per-tensor activation scale turns
  into coarse steps for every other channel. Each weight MatMul's input channel ``j`` is
  divided by ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (a ``Mul`` inserted before the
  MatMuls that read that input) and the weight's row ``j`` multiplied by it: the float32
  function is unchanged, and the activation range moves into the weights, which are
  quantised per channel. ``max|X_j|`` is measured by running the float32 export over
  ``calibration.txt`` (256 sentences of the project's own CC0 demo corpus, beside this file).
- ``weights`` ``int8`` or ``uint8``, by default chosen for the CPU (``int8_weights_for_cpu``):
  ONNX Runtime multiplies uint8 activations by int8 weights with VNNI's ``vpdpbusd`` where the
  CPU has it (exact, and its fastest int8 kernel), and otherwise with ``vpmaddubsw``, whose
  16-bit pair sums saturate (up to 255 * 127 * 2); smoothing enlarges the weights and makes it
  worse. So int8 weights where the CPU has VNNI, and elsewhere uint8 weights, which take an
  exact kernel without it. Both compute their integers exactly; they differ by their
  quantisation grids.
- ``float32_layers``: which weight MatMuls stay float32. ``ffn_output`` (the default) the FFN
  output projections, the down-projections from the intermediate size to the hidden size,
  whose GELU inputs have outliers no smoothing factor folds away; ``ffn`` both FFN
  projections; ``none`` quantises every weight MatMul. Found by weight shape, so the rule holds
  for every architecture exported here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, get_args

import numpy as np
from pairforge.pipeline.plumbing.errors import ConfigError

log = logging.getLogger("pairforge")

COMPUTE_TYPES: tuple[str, ...] = ("int8", "float32")
Float32Layers = Literal["none", "ffn_output", "ffn"]
FLOAT32_LAYERS: tuple[str, ...] = get_args(Float32Layers)
Int8Weights = Literal["uint8", "int8"]
INT8_WEIGHTS: tuple[str, ...] = get_args(Int8Weights)
# Chosen on MiniLM: benchmarks/results/embed_int8-2026-11-26-smoothquant-recipes.md.
SMOOTH_ALPHA = 0.8
CALIBRATION = Path(__file__).with_name("calibration.txt")
CALIBRATION_BATCH = 32
# The encoders whose transformers classes export with token states and an optional pooler, and
# whose inputs are the tokenizer's (input_ids, attention_mask[, token_type_ids]).
MODEL_TYPES: tuple[str, ...] = ("bert", "distilbert", "roberta", "xlm-roberta", "electra")
OPSET = 17
MODEL_FILE = "model.onnx"
# /proc/cpuinfo flags of the int8 dot-product instructions ONNX Runtime's u8s8 kernels use.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def int8_weights_for_cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> Int8Weights:
    """``int8`` where this CPU has VNNI (ONNX Runtime's exact and fastest uint8 x int8 kernel),
    else ``uint8`` (exact without it; the module's docstring). Read from ``cpuinfo``'s flags,
    so ``uint8`` where there is none to read (not Linux, not x86)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "uint8"
    for line in text.splitlines():
        if line.startswith("flags"):
            return "int8" if VNNI_FLAGS & set(line.partition(":")[2].split()) else "uint8"
    return "uint8"


@dataclass(frozen=True)
class Int8Recipe:
    """How the int8 model is made from the float32 export (the module's docstring): which
    weight MatMuls stay float32, the weights' type, and the SmoothQuant alpha (None: no
    smoothing). Each recipe is its own cached model, named by ``name``."""

    float32_layers: Float32Layers = "ffn_output"
    weights: Int8Weights = "uint8"
    smooth: float | None = SMOOTH_ALPHA

    def __post_init__(self) -> None:
        if self.float32_layers not in FLOAT32_LAYERS:
            raise ConfigError(
                f"float32_layers {self.float32_layers!r}: allowed {', '.join(FLOAT32_LAYERS)}"
            )
        if self.weights not in INT8_WEIGHTS:
            raise ConfigError(f"weights {self.weights!r}: allowed {', '.join(INT8_WEIGHTS)}")
        if self.smooth is not None and not 0.0 <= self.smooth <= 1.0:
            raise ConfigError(f"smooth {self.smooth!r}: an alpha in [0, 1], or None")

    @property
    def name(self) -> str:
        smooth = f"-smooth{self.smooth:g}" if self.smooth is not None else ""
        return f"{self.float32_layers}-{self.weights}{smooth}"

    def record(self) -> dict[str, Any]:
        """What the cached model's record says of it (with the calibration file's digest)."""
        out: dict[str, Any] = {
            "float32_layers": self.float32_layers,
            "weights": self.weights,
            "smooth": self.smooth,
        }
        if self.smooth is not None:
            out["calibration"] = _calibration_digest()
        return out


@functools.cache
def default_recipe() -> Int8Recipe:
    """The engine's recipe on this CPU: smoothed at ``SMOOTH_ALPHA``, FFN outputs float32, and
    the weights ``int8_weights_for_cpu`` picks."""
    return Int8Recipe(weights=int8_weights_for_cpu())


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
    recipe: Int8Recipe | None = None,
) -> tuple[Any, ORTModel, int]:
    """(tokenizer, :class:`ORTModel`, dim) of a model spec, exported (and quantised) on first
    use and loaded from ``models_dir`` after. ``threads`` > 0 sets ONNX Runtime's intra-op
    threads (else its default, one per core). ``recipe`` says how int8 is made (default:
    ``default_recipe()``). A ConfigError names the spec when the model cannot be found or
    exported, or the settings do not apply."""
    import onnxruntime as ort
    from pairforge.pipeline.science.models.files import resolve_translation_model
    from transformers import AutoConfig, AutoTokenizer

    if compute_type not in COMPUTE_TYPES:
        raise ConfigError(
            f"compute_type {compute_type!r} is not available for the onnxruntime engine: "
            f"allowed {', '.join(COMPUTE_TYPES)}"
        )
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
    recipe = recipe or default_recipe()
    if compute_type == "int8" and recipe.weights == "int8" and int8_weights_for_cpu() == "uint8":
        log.warning(
            "int8 weights on a CPU without VNNI: ONNX Runtime's kernel saturates their products "
            "(vectors further from float32); uint8 weights suit it"
        )
    folder, _ = convert_onnx(ref, compute_type, models_dir, recipe)
    session = ort.InferenceSession(
        str(folder / MODEL_FILE), session_options(threads), providers=["CPUExecutionProvider"]
    )
    return tokenizer, ORTModel(session), int(config.hidden_size)


def session_options(threads: int = -1) -> Any:
    """The ``SessionOptions`` of every session this module runs: ``threads`` > 0 intra-op
    threads (else ONNX Runtime's default, one per core), one inter-op thread, no spinning, and
    errors only in the log."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(threads, 0)  # 0: ONNX Runtime's default
    options.inter_op_num_threads = 1
    # As torch's OMP_WAIT_POLICY=PASSIVE (encoder.load_text_encoder): spinning idle threads
    # cost the other jobs of a shared CPU more than they save this one.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its graph-fusion notes are not the user's
    return options


def convert_onnx(
    ref: Any,
    compute_type: str,
    models_dir: str,
    recipe: Int8Recipe | None = None,
) -> tuple[Path, bool]:
    """The ONNX model of ``ref`` (a ``modelfiles.ModelRef``) at ``compute_type``, int8 made by
    ``recipe`` (default: ``default_recipe()``): ``(folder, made now)``.

    Made once per (model, revision, compute type, int8 recipe) and reused by every later run;
    int8 is quantised from the float32 export, itself made once. A lock keeps concurrent workers
    from making it twice, and the folder appears only when complete.
    """
    from pairforge.pipeline.science.models.files import made_once

    recipe = recipe or default_recipe()
    name = "onnx-float32" if compute_type == "float32" else f"onnx-int8-{recipe.name}"
    source = None
    if compute_type == "int8":
        source, _ = convert_onnx(ref, "float32", models_dir)  # outside this folder's lock

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        if source is None:
            log.info("exporting %s to ONNX (float32), once, into %s", ref.spec, models_dir)
            _export(ref, tmp / MODEL_FILE)
        else:
            log.info("quantising %s's ONNX export to int8 (%s), once, into %s",
                     ref.spec, recipe.name, models_dir)  # fmt: skip
            _quantize(ref, source / MODEL_FILE, tmp / MODEL_FILE, recipe)

    record: dict[str, Any] = {
        "spec": ref.spec,
        "revision": ref.revision,
        "compute_type": compute_type,
    }
    if source is not None:
        record.update(recipe.record())
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


def _quantize(
    ref: Any,
    source: Path,
    path: Path,
    recipe: Int8Recipe,
) -> None:
    """``quantize_dynamic`` of the float32 model at ``source`` (smoothed first when the recipe
    says) into ``path``: the recipe's weights per output channel, the weight MatMuls only
    (embeddings and activation-by-activation products stay float32), its ``float32_layers``
    excluded."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded = float32_matmuls(source, recipe.float32_layers)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        if recipe.smooth is not None:
            from transformers import AutoTokenizer

            smoothed = Path(scratch) / MODEL_FILE
            tokenizer = AutoTokenizer.from_pretrained(ref.path)
            smooth_weights(source, smoothed, recipe.smooth, tokenizer)
            source = smoothed
        with warnings.catch_warnings(), _quiet_root_logger():
            warnings.simplefilter("ignore")
            quantize_dynamic(
                str(source),
                str(path),
                weight_type=QuantType.QUInt8 if recipe.weights == "uint8" else QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=excluded,
            )


def calibration_texts() -> list[str]:
    """The sentences smoothing measures activations on (``calibration.txt``)."""
    return [t for t in CALIBRATION.read_text(encoding="utf-8").splitlines() if t.strip()]


def _calibration_digest() -> str:
    import hashlib

    return hashlib.sha256(CALIBRATION.read_bytes()).hexdigest()[:16]


def weight_matmuls(graph: Any) -> dict[str, list[Any]]:
    """The MatMul nodes with a 2-d initializer weight, grouped by the activation they read (a
    BERT's query, key and value projections read one)."""
    shapes = {t.name: len(t.dims) for t in graph.initializer}
    groups: dict[str, list[Any]] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and shapes.get(node.input[1]) == 2:
            groups.setdefault(node.input[0], []).append(node)
    return groups


def activation_ranges(model: Any, names: list[str], tokenizer: Any, texts: list[str]) -> dict:
    """``max |x|`` per channel (last axis) of each tensor in ``names``, over every token
    (padding included, as the run-time quantiser sees them) of ``texts`` run through the ONNX
    ``model`` (a ModelProto, not modified) in batches of ``CALIBRATION_BATCH``."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in names:
        probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(
        probe.SerializeToString(), session_options(), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name for i in session.get_inputs()}
    ranges: dict[str, np.ndarray] = {}
    for start in range(0, len(texts), CALIBRATION_BATCH):
        batch = tokenizer(
            texts[start : start + CALIBRATION_BATCH],
            padding=True,
            truncation=True,
            max_length=128,
            return_tensors="np",
        )
        feed = {k: np.asarray(v, dtype=np.int64) for k, v in batch.items() if k in inputs}
        if "token_type_ids" in inputs and "token_type_ids" not in feed:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        for name, x in zip(names, session.run(names, feed), strict=True):
            top = np.abs(x.reshape(-1, x.shape[-1])).max(0)  # (channels,)
            ranges[name] = np.maximum(ranges[name], top) if name in ranges else top
    return ranges


def smooth_weights(source: Path, path: Path, alpha: float, tokenizer: Any) -> None:
    """SmoothQuant of the float32 ONNX model at ``source`` into ``path``: each weight MatMul's
    input channel ``j`` divided by ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (the weight
    maximum over every MatMul reading that input), by a ``Mul`` inserted before them, and
    each weight's row ``j`` multiplied by ``s_j``. The float32 function is unchanged (up to
    rounding); the activations' channel outliers move into the per-channel-quantised
    weights. Activation maxima come from ``calibration_texts``."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    groups = weight_matmuls(graph)
    xmax = activation_ranges(model, list(groups), tokenizer, calibration_texts())
    initializers = {t.name: t for t in graph.initializer}
    muls: dict[str, Any] = {}  # a smoothed tensor's name -> the Mul that makes it
    for i, (name, nodes) in enumerate(groups.items()):
        mats = [numpy_helper.to_array(initializers[n.input[1]]) for n in nodes]  # (in, out)
        wmax = np.max([np.abs(w).max(1) for w in mats], axis=0)  # (in,)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.power(xmax[name], alpha) / np.power(wmax, 1.0 - alpha)
        # A channel that never fires, or whose weights are all zero, is left as it is.
        scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0).astype(np.float32)
        inverse = numpy_helper.from_array((1.0 / scale).astype(np.float32), f"smooth_inv_{i}")
        graph.initializer.append(inverse)
        smoothed = f"{name}_smoothed"
        muls[smoothed] = helper.make_node(
            "Mul", [name, inverse.name], [smoothed], name=f"smooth_mul_{i}"
        )
        for node, w in zip(nodes, mats, strict=True):
            node.input[0] = smoothed
            weight = numpy_helper.from_array((w * scale[:, None]).astype(np.float32), node.input[1])
            initializers[node.input[1]].CopyFrom(weight)
    ordered = []
    for node in graph.node:  # topological: a Mul goes just before the first node reading it
        ordered.extend(muls.pop(x) for x in node.input if x in muls)
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
    onnx.save(model, str(path))


@contextlib.contextmanager
def _quiet_root_logger():
    """ONNX Runtime's quantiser advises pre-processing (symbolic shapes, graph optimisation)
    through ``logging.warning``, on the root logger, which that call also configures when it has
    no handler. Not taken: the int8 records measure the export quantised as it is; and the user's
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
