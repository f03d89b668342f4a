"""The onnxruntime engine (``pipeline/science/models/ort.py``) on a tiny BERT built in the test: float32
gives the transformers engine's vectors for every pooling, int8 stays close, the export and the
quantisation are made once, the layers int8 keeps in float32 are the FFN projections, and
settings or models it cannot take are one clear error."""

from __future__ import annotations

import hashlib
import json
import logging
import re

import numpy as np
import onnxruntime  # noqa: F401 (required: a broken install must fail, not skip)
import pytest
from pairforge.pipeline.plumbing.errors import ConfigError, PairforgeError
from pairforge.pipeline.science.models import SentenceEncoder, load_text_encoder
from pairforge.pipeline.science.models.files import resolve_translation_model
from pairforge.pipeline.science.models.ort import (
    CALIBRATION,
    MODEL_FILE,
    Int8Recipe,
    ORTModel,
    calibration_texts,
    convert_onnx,
    default_recipe,
    float32_matmuls,
    int8_weights_for_cpu,
    smooth_weights,
    weight_matmuls,
)

from tests.stages.mining_fixtures import one_torch_thread  # noqa: F401
from tests.stages.mining_helpers import make_texts

POOLINGS = ["mean", "cls", "cls_before_pooler", "mask"]


def _encoder(model, pooling, models_dir, **kw) -> SentenceEncoder:
    return load_text_encoder(
        str(model),
        pooling,
        device="cpu",
        batch_size=8,
        max_length=32,
        threads=1,
        models_dir=str(models_dir),
        **kw,
    )


def _folders(models_dir) -> list[str]:
    return sorted(p.name for p in models_dir.iterdir() if not p.name.startswith("."))


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return make_texts(40, seed=5)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """The module's exports of the tiny BERT (made by the first test that needs them)."""
    return tmp_path_factory.mktemp("onnx")


@pytest.mark.parametrize("pooling", POOLINGS)
def test_float32_engine_equals_transformers_and_int8_stays_close(
    tiny_bert, texts, models_dir, pooling
):
    torch_vectors = _encoder(tiny_bert, pooling, models_dir).encode(texts)
    fp32 = _encoder(tiny_bert, pooling, models_dir, engine="onnxruntime", compute_type="float32")
    int8 = _encoder(tiny_bert, pooling, models_dir, engine="onnxruntime", compute_type="int8")
    got32, got8 = fp32.encode(texts), int8.encode(texts)
    assert got8.shape == (40, 32) and got8.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got8, axis=1), 1.0, atol=1e-5)
    # The same weights in float32: the same vectors (padding, token types, the pooler's output,
    # and batches without padding though the graph was traced on a padded one).
    np.testing.assert_allclose(got32, torch_vectors, atol=1e-4)
    # int8 weights and per-tensor int8 activations on a random 32-d model: measured cosine
    # 0.988-0.997 at worst and 0.991-0.999 on average over the poolings, components off by
    # 0.03-0.13. MiniLM on the STS sentences is measured in docs/mine.md.
    cos = np.einsum("ij,ij->i", got8, torch_vectors)
    assert cos.min() > 0.98 and cos.mean() > 0.99, (cos.min(), cos.mean())
    # It did run quantised: int8 errors are far above float32's (CPUs differ: 2e-3 to 0.13 at
    # worst measured on AMD EPYC and Intel, against 1e-6 for float32).
    assert np.abs(got8 - torch_vectors).max() > 1e-3 > 10 * np.abs(got32 - torch_vectors).max()
    info = int8.info()
    assert (info["engine"], info["compute_type"], info["dtype"]) == (
        "onnxruntime",
        "int8",
        "float32",
    )
    assert fp32.info()["compute_type"] == "float32"


def test_export_and_quantisation_are_made_once(tiny_bert, texts, tmp_path, caplog):
    models_dir = tmp_path / "onnx"
    with caplog.at_level(logging.INFO, logger="pairforge"):
        first = _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime").encode(texts)
    assert caplog.text.count("exporting") == 1 and caplog.text.count("quantising") == 1
    # The weights are this CPU's (int8 with VNNI, else uint8).
    weights = int8_weights_for_cpu()
    assert [f.split("-onnx-")[1] for f in _folders(models_dir)] == [
        "float32",
        f"int8-ffn_output-{weights}-smooth0.8",
    ]
    assert default_recipe() == Int8Recipe("ffn_output", weights, 0.8)
    stamps = {p: p.stat().st_mtime_ns for p in models_dir.rglob(MODEL_FILE)}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pairforge"):
        again = _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime").encode(texts)
        _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", compute_type="float32")
    assert "exporting" not in caplog.text and "quantising" not in caplog.text
    assert {p: p.stat().st_mtime_ns for p in models_dir.rglob(MODEL_FILE)} == stamps
    np.testing.assert_array_equal(first, again)
    # Another set of float32 layers: a new quantisation of the same export.
    ref = resolve_translation_model(str(tiny_bert))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pairforge"):
        folder, made = convert_onnx(ref, "int8", str(models_dir), Int8Recipe("none", "uint8"))
    assert made and "exporting" not in caplog.text and caplog.text.count("quantising") == 1
    assert len(_folders(models_dir)) == 3
    assert folder.name.endswith("-onnx-int8-none-uint8-smooth0.8")
    source = json.loads((folder / "pairforge-source.json").read_text())
    assert source == {
        "spec": str(tiny_bert),
        "revision": ref.revision,
        "compute_type": "int8",
        "float32_layers": "none",
        "weights": "uint8",
        "smooth": 0.8,
        "calibration": hashlib.sha256(CALIBRATION.read_bytes()).hexdigest()[:16],
    }
    # Unsmoothed, int8 weights: the recipe is in the name.
    plain, made = convert_onnx(ref, "int8", str(models_dir), Int8Recipe("none", "int8", None))
    assert made and plain.name.endswith("-onnx-int8-none-int8")
    assert "calibration" not in json.loads((plain / "pairforge-source.json").read_text())
    assert not [p for p in models_dir.iterdir() if re.search(r"\.tmp-\d+$", p.name)]


def test_float32_layers_are_the_ffn_projections(tiny_bert, models_dir, texts):
    ref = resolve_translation_model(str(tiny_bert))
    export, _ = convert_onnx(ref, "float32", str(models_dir))
    out = float32_matmuls(export / MODEL_FILE, "ffn_output")
    both = float32_matmuls(export / MODEL_FILE, "ffn")
    # 2 layers: their output projections (64 -> 32), then also the input ones (32 -> 64).
    assert len(out) == 2 and all("/output/dense/" in n and "attention" not in n for n in out)
    assert len(both) == 4 and set(out) < set(both)
    assert all("/intermediate/dense/" in n for n in set(both) - set(out))
    assert float32_matmuls(export / MODEL_FILE, "none") == []
    # What a quantisation keeps in float32 changes the vectors.
    import onnx

    kept = {}
    for layers in ("none", "ffn_output"):
        folder, _ = convert_onnx(ref, "int8", str(models_dir), Int8Recipe(layers))
        graph = onnx.load(str(folder / MODEL_FILE)).graph
        kept[layers] = sorted(n.name for n in graph.node if n.op_type == "MatMul")
    assert set(out) <= set(kept["ffn_output"]) and not set(out) & set(kept["none"])


def test_bad_settings_and_models_are_clear_errors(tiny_bert, models_dir, tmp_path):
    with pytest.raises(ConfigError, match="dtype 'bfloat16' applies to the transformers engine"):
        _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", dtype="bfloat16")
    with pytest.raises(ConfigError, match="'int8_float16' is not available for the onnxruntime"):
        _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", compute_type="int8_float16")
    with pytest.raises(ConfigError, match="the onnxruntime engine runs on cpu"):
        load_text_encoder(str(tiny_bert), "mean", device="cuda", engine="onnxruntime")
    with pytest.raises(ConfigError, match="weights 'int4': allowed uint8, int8"):
        Int8Recipe(weights="int4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="weights 'int4': allowed uint8, int8"):
        _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", int8_weights="int4")
    with pytest.raises(ConfigError, match=r"smooth 1.5: an alpha in \[0, 1\]"):
        Int8Recipe(smooth=1.5)
    with pytest.raises(ConfigError, match="float32_layers 'all': allowed none, ffn_output, ffn"):
        Int8Recipe("all")  # type: ignore[arg-type]
    enc = _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime")
    assert enc.model.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(PairforgeError, match="no training mode"):
        enc.encode(["a sentence"], dropout=True)
    with pytest.raises(ConfigError, match="no such folder"):
        _encoder(tmp_path / "missing", "mean", models_dir, engine="onnxruntime")

    # An architecture it does not export: a tiny GPT-2, named by its model_type.
    from transformers import GPT2Config, GPT2Model

    gpt2 = tmp_path / "gpt2"
    GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50)).save_pretrained(gpt2)
    with pytest.raises(ConfigError, match="exports BERT-family encoders .* not model_type 'gpt2'"):
        _encoder(gpt2, "mean", models_dir, engine="onnxruntime")

    # A BERT whose weights do not load: the export fails with one line naming the model, and
    # leaves neither a folder nor a temporary behind.
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in tiny_bert.iterdir():
        if file.name != "model.safetensors":
            (broken / file.name).write_bytes(file.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    empty = tmp_path / "empty-onnx"
    with pytest.raises(ConfigError, match=r"model '.*broken': ONNX export failed: \w+") as err:
        _encoder(broken, "mean", empty, engine="onnxruntime")
    assert "\n" not in str(err.value)
    assert [p for p in empty.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("kind", ["roberta", "distilbert", "electra"])
def test_other_bert_family_encoders_export_with_torchs_vectors(kind, tiny_bert, texts, tmp_path):
    """The other model types it takes, tiny and random, on the tiny BERT's WordPiece vocabulary
    (DistilBERT's tokenizer without token types, as DistilBERT's own)."""
    import torch
    from transformers import (
        BertTokenizerFast,
        DistilBertConfig,
        DistilBertModel,
        ElectraConfig,
        ElectraModel,
        RobertaConfig,
        RobertaModel,
    )

    inputs = ["input_ids", "attention_mask"] if kind == "distilbert" else None
    extra = {"model_input_names": inputs} if inputs else {}
    tokenizer = BertTokenizerFast.from_pretrained(str(tiny_bert), **extra)
    size = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    torch.manual_seed(0)
    if kind == "roberta":  # positions start after the padding index
        model = RobertaModel(
            RobertaConfig(
                **size,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=160,
            )
        )
    elif kind == "distilbert":
        model = DistilBertModel(
            DistilBertConfig(**size, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
        )
    else:
        model = ElectraModel(
            ElectraConfig(
                **size,
                embedding_size=16,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
            )
        )
    folder = tmp_path / kind
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    want = _encoder(folder, "mean", tmp_path / "onnx").encode(texts)
    fp32 = _encoder(folder, "mean", tmp_path / "onnx", engine="onnxruntime", compute_type="float32")
    np.testing.assert_allclose(fp32.encode(texts), want, atol=1e-4)
    int8 = _encoder(folder, "mean", tmp_path / "onnx", engine="onnxruntime").encode(texts)
    assert np.einsum("ij,ij->i", int8, want).mean() > 0.98


def _with_outlier_channel(tiny_bert, folder, channel=5, factor=30.0):
    """The tiny BERT with one hidden channel ``factor`` times larger at every LayerNorm's output
    but the last (whose output is the token states): the outlier channel a pretrained BERT has,
    which a per-tensor activation scale quantises the other channels coarsely around."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(tiny_bert)).eval()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    with torch.no_grad():
        for norm in norms[:-1]:
            norm.weight[channel] *= factor
            norm.bias[channel] *= factor
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(tiny_bert)).save_pretrained(folder)
    return folder


def test_smoothing_keeps_the_function_and_tames_an_outlier_channel(tiny_bert, texts, tmp_path):
    """SmoothQuant: the smoothed float32 graph computes what the export does (a Mul before each
    group of MatMuls reading one input, the weights' rows scaled by as much), and on a model with
    an outlier channel the smoothed int8 vectors are much closer to float32 than unsmoothed
    int8 with the same weights and layers."""
    import onnx
    import onnxruntime as ort
    from transformers import AutoTokenizer

    folder = _with_outlier_channel(tiny_bert, tmp_path / "outlier")
    models_dir = tmp_path / "onnx"
    ref = resolve_translation_model(str(folder))
    export, _ = convert_onnx(ref, "float32", str(models_dir))
    smoothed = tmp_path / "smoothed.onnx"
    smooth_weights(export / MODEL_FILE, smoothed, 0.8, AutoTokenizer.from_pretrained(folder))

    graph = onnx.load(str(smoothed)).graph
    groups = weight_matmuls(onnx.load(str(export / MODEL_FILE)).graph)
    muls = [n for n in graph.node if n.name.startswith("smooth_mul_")]
    # Per layer: QKV (one input), attention output, FFN in, FFN out. (The pooler's dense, on 2-d
    # input, exports as a Gemm: not quantised.)
    assert len(muls) == len(groups) == 2 * 4
    assert sorted(len(nodes) for nodes in groups.values()) == [1] * 6 + [3] * 2
    # Each Mul comes before the MatMuls that read its output (a valid topological order).
    position = {o: i for i, n in enumerate(graph.node) for o in n.output}
    for i, node in enumerate(graph.node):
        assert all(position.get(x, -1) < i for x in node.input)

    def run(path):
        model = ORTModel(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))
        enc = _encoder(folder, "mean", models_dir)
        enc.model = model
        return enc.encode(texts)

    want = run(export / MODEL_FILE)
    np.testing.assert_allclose(run(smoothed), want, atol=1e-4)

    cosines = {}
    for smooth in (None, 0.8):
        q, _ = convert_onnx(ref, "int8", str(models_dir), Int8Recipe("none", "uint8", smooth))
        cosines[smooth] = np.einsum("ij,ij->i", run(q / MODEL_FILE), want)
    # Measured on this model (AMD EPYC, AVX2): 1 - cosine 5.8e-4 on average and 0.019 at worst
    # unsmoothed, 2.5e-5 and 5e-4 smoothed.
    error = {k: 1.0 - v for k, v in cosines.items()}
    summary = {k: (v.mean(), v.max()) for k, v in error.items()}
    assert error[0.8].mean() < 0.2 * error[None].mean(), summary
    assert error[0.8].max() < 0.002 < error[None].max(), summary


def test_calibration_sentences_are_the_projects_own():
    """256 distinct sentences, each one of the demo corpus's (CC0, written for the project)."""
    from pathlib import Path

    texts = calibration_texts()
    assert len(texts) == len(set(texts)) == 256
    demo = Path(__file__).resolve().parents[2] / "data" / "demo" / "corpus.txt"
    corpus = {" ".join(t.split()) for t in demo.read_text(encoding="utf-8").splitlines()}
    assert set(texts) <= corpus


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ("fpu sse2 avx avx2 fma", "uint8"),  # AVX2 without VNNI: vpmaddubsw saturates
        ("fpu avx2 avx512f avx512bw avx512_vnni", "int8"),
        ("fpu avx2 avx_vnni", "int8"),  # AVX-VNNI (256-bit)
        ("fpu avx2 amx_int8 avx512_vnni", "int8"),
        (None, "uint8"),  # a cpuinfo without flags (not x86)
    ],
)
def test_int8_weights_follow_the_cpus_vnni(tmp_path, flags, want):
    cpuinfo = tmp_path / "cpuinfo"
    lines = ["processor\t: 0", "model name\t: some CPU"]
    if flags is not None:
        lines.append(f"flags\t\t: {flags}")
    cpuinfo.write_text("\n".join(lines) + "\n")
    assert int8_weights_for_cpu(cpuinfo) == want
    assert int8_weights_for_cpu(tmp_path / "absent") == "uint8"  # not Linux


def test_the_int8_recipe_is_recorded_and_int8_weights_without_vnni_warn(
    tiny_bert, models_dir, texts, monkeypatch, caplog
):
    """The encoder's info names its int8 recipe (sample compares it); int8 weights on a CPU
    without VNNI run, with a warning that their products saturate there."""
    from pairforge.pipeline.science.models import ort

    monkeypatch.setattr(ort, "int8_weights_for_cpu", lambda: "uint8")
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        u8 = _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", int8_weights="uint8")
    assert "without VNNI" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="pairforge"):
        s8 = _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", int8_weights="int8")
    assert "int8 weights on a CPU without VNNI" in caplog.text
    assert u8.info()["int8_recipe"] == "ffn_output-uint8-smooth0.8"
    assert s8.info()["int8_recipe"] == "ffn_output-int8-smooth0.8"
    # Two quantisations: close to each other, not the same vectors.
    a, b = u8.encode(texts), s8.encode(texts)
    assert np.abs(a - b).max() > 0 and np.einsum("ij,ij->i", a, b).min() > 0.98
    f32 = _encoder(tiny_bert, "mean", models_dir, engine="onnxruntime", compute_type="float32")
    assert (
        "int8_recipe" not in f32.info()
        and "int8_recipe" not in _encoder(tiny_bert, "mean", models_dir).info()
    )
