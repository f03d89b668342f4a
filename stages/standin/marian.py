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
- **variation**: the output projection is untied. For a word of the substitution table
  (``stages.standin.synonyms``: synonyms written by hand, spelling and function-word variants,
  number words as digits; never antonyms or embedding neighbours) whose substitutes are whole-word
  pieces of the vocabulary, it mixes the word with its substitutes. A seeded share of those words
  (``substitute_rate``) is replaced by its first substitute under greedy decoding ("large" ->
  "big", "almost" -> "nearly"); for the others a substitute is a plausible sample. Each
  direction gets its own seed, so a round trip varies its input. Every other word is copied.
  Word order never changes: the construction copies position by position.

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

from pairforge.pipeline.science.models.files import STANDIN_FILE

NOTE = (
    "STAND-IN MODEL, NOT A TRANSLATION MODEL: a tiny MarianMT built locally by `pairforge "
    "standin` (copy by construction, with seeded substitutions from a hand-written synonym "
    "table) so that "
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


def train_vocabulary(texts: Iterable[str], vocab_size: int, words: Iterable[str] = ()) -> bytes:
    """A unigram sentencepiece model trained on ``texts`` (serialized); each of ``words`` is
    forced in as a whole-word piece (``"\u2581" + word``), on top of ``vocab_size``."""
    symbols = sorted({"\u2581" + w for w in words})
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(texts)),
        model_writer=model,
        vocab_size=vocab_size + len(symbols),
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        num_threads=1,  # one thread: the same corpus always gives the same vocabulary
        minloglevel=2,
        user_defined_symbols=symbols,
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


def table_words(table: dict[str, tuple[str, ...]]) -> list[str]:
    """Every word of ``table``, lower case and capitalised, sorted."""
    words = {w for word, subs in table.items() for w in (word, *subs)}
    return sorted({f for w in words for f in (w, w[:1].upper() + w[1:])})


def table_substitutes(
    vocab: dict[str, int], words: set[str], table: dict[str, tuple[str, ...]]
) -> dict[int, list[tuple[int, float]]]:
    """For each whole-word piece of ``vocab`` (in ``words``) that ``table`` lists, its substitutes
    that are word-initial pieces of ``vocab``, as ``(id, weight)`` in table order (weights 1.0).
    Case follows the word: "Large" -> "Big" when both pieces exist; a substitute missing from
    the vocabulary is skipped, and a word left with none is always copied."""
    out: dict[int, list[tuple[int, float]]] = {}
    for piece, index in vocab.items():
        if piece not in words or not piece.startswith("\u2581"):
            continue
        word = piece[1:]
        subs = table.get(word.lower())
        if not subs:
            continue
        capital = word[:1].isupper()
        found = []
        for sub in subs:
            form = sub[:1].upper() + sub[1:] if capital else sub
            other = "\u2581" + form
            if other in vocab and vocab[other] != index:
                found.append((vocab[other], 1.0))
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
    """A MarianMTModel that copies its input, with the seeded substitutions described above.
    ``neighbours``: piece id -> ``[(substitute id, weight), ...]`` (:func:`table_substitutes`);
    empty: an exact copier."""
    import torch
    from transformers import MarianMTModel

    if d_model < 192 or d_model % heads:
        raise ValueError("d_model must be >= 192 and divisible by heads")
    # One seed, drawn in a fixed order (initial weights, token vectors, substitutions): the
    # model files are the same bytes on every run, and backtranslate's cache keys hold.
    torch.manual_seed(seed)
    model = MarianMTModel(_marian_config(vocab, d_model, heads)).eval()
    gen = torch.Generator().manual_seed(seed)
    match, zero = _position_match(d_model)
    emb = _token_embeddings(len(vocab), d_model, match, zero, vocab["<pad>"], gen)
    mix = _substitution_mix(len(vocab), neighbours, substitute_rate, gen)
    with torch.no_grad():
        _set_embeddings(model, emb, sharpness / TOKEN_NORM**2 * mix @ emb)
        _zero_blocks(model)
        _set_copy_attention(model.model.decoder.layers[0].encoder_attn, match, zero, heads)
    return model


def _marian_config(vocab: dict[str, int], d_model: int, heads: int):
    """The stand-in's ``MarianConfig``: one encoder and one decoder layer of ``d_model`` with
    ``heads`` heads, untied output projection, no dropout, Marian's ``<pad>`` start token."""
    from transformers import MarianConfig

    pad = vocab["<pad>"]
    return MarianConfig(
        vocab_size=len(vocab),
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


def _position_match(d_model: int) -> tuple[list[int], int]:
    """The dimensions of the sinusoidal position code that the position match reads (the sin
    and cos of :data:`POSITION_FREQUENCIES`), and ``zero``: the sin of the lowest frequency."""
    match = [*POSITION_FREQUENCIES, *(d_model // 2 + k for k in POSITION_FREQUENCIES)]
    zero = d_model // 2 - 1  # sin of the lowest frequency: ~0 for every position used
    return match, zero


def _token_embeddings(size: int, d_model: int, match: list[int], zero: int, pad: int, gen):
    """``(size, d_model)`` token embeddings: seeded random vectors of norm :data:`TOKEN_NORM`
    and zero mean, in the dimensions outside ``match`` and ``zero``; ``pad``'s row is zero."""
    import torch

    token_dims = [i for i in range(d_model) if i not in set(match) and i != zero]
    vectors = torch.randn(size, len(token_dims), generator=gen)
    vectors -= vectors.mean(1, keepdim=True)  # LayerNorm's mean shift then cancels in logits
    vectors = TOKEN_NORM * vectors / vectors.norm(dim=1, keepdim=True)
    emb = torch.zeros(size, d_model)
    emb[:, token_dims] = vectors
    emb[pad] = 0.0  # Marian (and CTranslate2) start the decoder from a zero embedding
    return emb


def _substitution_mix(
    size: int, neighbours: dict[int, list[tuple[int, float]]], substitute_rate: float, gen
):
    """``(size, size)`` output mix, ``mix[out, in]``: the weight of output token ``out`` when
    copying ``in``. The identity, except for the words of ``neighbours``: a seeded
    ``substitute_rate`` share of them puts its first substitute first under greedy decoding, the
    others keep the word first and their substitutes as samples. Every column sums to 1."""
    import torch

    mix = torch.eye(size)
    for index, found in neighbours.items():
        substitute = torch.rand(1, generator=gen).item() < substitute_rate
        weights = torch.tensor([w for _, w in found])
        # Each row sums to 1 like a copied word's, so that sampling stays between the word and
        # its substitutes instead of drifting to unrelated pieces.
        if substitute:  # the first substitute outweighs the word itself under greedy decoding
            mix[index, index] = 0.35
            share = torch.zeros(len(found))
            share[0] = 0.65 if len(found) == 1 else 0.5
            if len(found) > 1:
                share[1:] = 0.15 * weights[1:] / weights[1:].sum()
        else:  # the word wins greedy decoding; its substitutes are plausible samples
            mix[index, index] = 0.65
            share = 0.35 * weights / weights.sum()
        for (other, _), weight in zip(found, share, strict=True):
            mix[other, index] += float(weight)
    return mix


def _set_embeddings(model, emb, lm_head) -> None:
    """Copy ``emb`` into the shared, encoder and decoder token tables and ``lm_head`` into the
    output projection (its bias zero). Under ``torch.no_grad()``."""
    for table in (
        model.model.shared,
        model.model.encoder.embed_tokens,
        model.model.decoder.embed_tokens,
    ):
        table.weight.copy_(emb)
    model.lm_head.weight.copy_(lm_head)
    model.final_logits_bias.zero_()


def _zero_blocks(model) -> None:
    """Zero every layer's self-attention output and feed-forward output, so that the residual
    stream carries only the embeddings and the cross-attention. Under ``torch.no_grad()``."""
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        for block in (layer.self_attn.out_proj, layer.fc2):
            block.weight.zero_()
            block.bias.zero_()


def _set_copy_attention(cross, match: list[int], zero: int, heads: int) -> None:
    """Make the decoder's cross-attention ``cross`` read the source token at its own position:
    query and key compare the ``match`` dimensions of the position code (less ``zero``, which
    cancels LayerNorm's mean shift), scaled by :data:`QUERY_GAIN`; the value path carries the
    token, :data:`VALUE_GAIN` times. Under ``torch.no_grad()``."""
    import torch

    d_model = cross.q_proj.weight.shape[1]
    heads_dim = d_model // heads
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


def pair_seed(seed: int, pair: str) -> int:
    digest = hashlib.blake2b(f"{seed}\x1f{pair}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def build_standins(
    texts: list[str],
    output: Path,
    pairs: list[str],
    *,
    vocab_size: int,
    synonyms: str | None,
    substitute_rate: float,
    sharpness: float,
    seed: int,
) -> dict[str, dict]:
    """Write one stand-in model folder per language pair (``opus-mt-<pair>``) under ``output``;
    returns what each folder's ``pairforge-standin.json`` says. ``synonyms``: the substitution
    table (``synonyms.load_table``: ``builtin``, a TSV path, or None for exact copies)."""
    from pairforge.stages.standin.synonyms import load_table

    table = load_table(synonyms)
    # The table's words are forced into the vocabulary as whole-word pieces, so that a
    # substitute the corpus lacks ("nearly" for its "almost") is a piece the model can write.
    spm_model = train_vocabulary(texts, vocab_size, table_words(table))
    vocab = marian_vocab(spm_model)
    substitutes = {}
    if table:
        # A word is substituted only where its piece always ends a word in the corpus ("big"
        # starts "bigger": it would give "largeger").
        whole = whole_words(spm_model, texts, min_share=1.0)
        substitutes = table_substitutes(vocab, whole, table)
    id_to_piece = {i: p for p, i in vocab.items()}
    used = {
        id_to_piece[i][1:]: [id_to_piece[j][1:] for j, _ in found]
        for i, found in sorted(substitutes.items())
    }
    written = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pair in pairs:
            folder = output / f"opus-mt-{pair}"
            shutil.rmtree(folder, ignore_errors=True)
            s = pair_seed(seed, pair)
            model = build_model(vocab, substitutes, s, substitute_rate, sharpness)
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
                "synonyms": synonyms,
                "words_with_substitutes": len(substitutes),
                # Every substitution the model can make: a reader can audit it in one place.
                "substitutions": used,
            }
            (folder / STANDIN_FILE).write_text(json.dumps(info, indent=2) + "\n")
            written[pair] = info
    return written
