"""Translation engines behind one interface, and where their models come from.

``Translator`` is what the per-shard function sees: ``encode`` turns texts into source token ids
(the model's own tokenizer, truncated), ``translate`` turns one batch of ids into ``n`` output
texts per input under a ``Decoding``. Two engines implement it:

- ``transformers``: ``AutoModelForSeq2SeqLM.generate`` (MarianMTModel for Opus-MT) on CPU or GPU,
  in float32, bfloat16 or float16;
- ``ctranslate2``: the same model converted once with CTranslate2's ``TransformersConverter``
  and kept under ``models_dir`` keyed by model, revision and quantization; int8 (or float32,
  int8_float32) on CPU, float16, int8_float16 (or bfloat16, int8_bfloat16, float32) on GPU.

A third, ``apertium``, is rule-based and text to text (``stages.backtranslate.apertium``): its
"models" are ``apertium:<mode>`` specs, it has one output per input (greedy decoding only) and no
token limits, so ``translate.translate_texts`` hands it texts rather than token ids.

The Marian engines tokenise and detokenise with the model's Hugging Face tokenizer and stop at ``max_new``
output tokens; the transformers engine suppresses the pad token (Marian's decoder start token,
which CTranslate2's conversion removes from the vocabulary), so a float32 CTranslate2 model and
the transformers model give the same greedy output. Neither engine samples: both hand their
next-token logits to ``stages.backtranslate.sampling``, which draws each row's token from the row's own
seeded stream.

Models are resolved and converted by ``pipeline.science.models.files``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models import hub_kwargs
from pairforge.pipeline.science.models.apertium import apertium_version
from pairforge.pipeline.science.models.files import ModelRef, convert_ctranslate2
from pairforge.stages.backtranslate.apertium import ApertiumTranslator
from pairforge.stages.backtranslate.decoding import Decoding
from pairforge.stages.backtranslate.sampling import choose_tokens, row_seeds, uniforms_table

log = logging.getLogger("pairforge")

ENGINES: tuple[str, ...] = ("transformers", "ctranslate2", "apertium")
COMPUTE_TYPES = {
    ("transformers", "cpu"): ("float32", "bfloat16"),
    ("transformers", "cuda"): ("float16", "bfloat16", "float32"),
    ("ctranslate2", "cpu"): ("int8", "int8_float32", "float32"),
    ("ctranslate2", "cuda"): ("float16", "int8_float16", "bfloat16", "int8_bfloat16", "float32"),
    ("apertium", "cpu"): ("rules",),
}


# --- engine settings --------------------------------------------------------------------------


CPU_ISAS: tuple[str, ...] = ("auto", "GENERIC", "AVX", "AVX2", "AVX512", "NEON")


@dataclass(frozen=True)
class EngineSettings:
    """The translation engine as resolved by ``engine_settings``: ``auto`` device, compute type
    and thread count replaced by what this machine gives. Not a twin of backtranslate's config,
    which holds the requested values and their defaults; this holds the resolved ones."""

    engine: str
    device: str
    compute_type: str
    threads: int
    models_dir: str
    cpu_isa: str

    def identity(self) -> dict[str, str]:
        """What of the engine changes outputs (device does not: same weights, same maths)."""
        if self.engine == "apertium":
            return {"engine": self.engine, "version": apertium_version()}
        identity = {"engine": self.engine, "compute_type": self.compute_type}
        if self.pins_cpu_isa:
            identity["cpu_isa"] = self.cpu_isa
        return identity

    @property
    def pins_cpu_isa(self) -> bool:
        return self.engine == "ctranslate2" and self.device == "cpu" and self.cpu_isa != "auto"


def _cuda_available(engine: str) -> bool:
    if engine == "ctranslate2":
        import ctranslate2

        return ctranslate2.get_cuda_device_count() > 0
    import torch

    return torch.cuda.is_available()


def engine_settings(
    engine: str,
    device: str,
    compute_type: str,
    threads: int,
    models_dir: str,
    cpu_isa: str = "auto",
) -> EngineSettings:
    """Validate and resolve ``auto`` device and compute type: CPU int8 / GPU int8_float16 for
    CTranslate2, CPU float32 / GPU float16 for transformers. ``cpu_isa`` pins the instruction
    set of CTranslate2's CPU kernels (``auto``: the best this CPU has)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r}: allowed values: {', '.join(ENGINES)}")
    if cpu_isa not in CPU_ISAS:
        raise ConfigError(f"cpu_isa {cpu_isa!r}: allowed values: {', '.join(CPU_ISAS)}")
    if engine == "ctranslate2" and device in ("auto", "cpu"):
        cpu_isa = pin_cpu_isa(cpu_isa)  # before the CUDA probe below imports ctranslate2
    if engine == "apertium" and device == "cuda":
        raise ConfigError("device 'cuda': the apertium engine runs on the CPU (auto or cpu)")
    if device == "auto":
        device = "cpu" if engine == "apertium" else "cuda" if _cuda_available(engine) else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: allowed values: auto, cpu, cuda")
    allowed = COMPUTE_TYPES[(engine, device)]
    if compute_type == "auto":
        compute_type = {
            ("transformers", "cpu"): "float32",
            ("transformers", "cuda"): "float16",
            ("ctranslate2", "cpu"): "int8",
            ("ctranslate2", "cuda"): "int8_float16",
            ("apertium", "cpu"): "rules",
        }[(engine, device)]
    if compute_type not in allowed:
        raise ConfigError(
            f"compute_type {compute_type!r} is not available for {engine} on {device}; "
            f"allowed values: auto, {', '.join(allowed)}"
        )
    if threads <= 0:
        threads = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    return EngineSettings(engine, device, compute_type, threads, models_dir, cpu_isa)


# --- the interface ----------------------------------------------------------------------------


class Translator(Protocol):
    """One loaded translation model."""

    ref: ModelRef
    settings: EngineSettings

    def encode(self, texts: list[str], max_tokens: int) -> list[list[int]]:
        """Source token ids per text (end-of-sentence included), truncated to ``max_tokens``."""
        ...

    def translate(
        self, batch: list[list[int]], decoding: Decoding, max_new: int, min_new: int, seed: int
    ) -> list[list[str]]:
        """``decoding.n`` output texts per input of ``batch``. Sampled outputs depend on each
        input's ids, the decoding and ``seed`` only, not on the rest of the batch
        (``stages.backtranslate.sampling``)."""
        ...


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        # MarianTokenizer recommends sacremoses for punctuation normalisation it does not need.
        warnings.filterwarnings("ignore", message=".*sacremoses.*")
        return AutoTokenizer.from_pretrained(path, **hub_kwargs())


class _MarianText:
    """Tokenisation shared by both engines, so that their inputs and outputs match exactly."""

    def __init__(self, ref: ModelRef, settings: EngineSettings) -> None:
        self.ref = ref
        self.settings = settings
        self.tokenizer = _load_tokenizer(ref.path)
        self.pad_id = self.tokenizer.pad_token_id
        from transformers import AutoConfig

        # Positions the model has embeddings for bound both the source and the output length.
        config = AutoConfig.from_pretrained(ref.path, **hub_kwargs())
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)

    def encode(self, texts: list[str], max_tokens: int) -> list[list[int]]:
        if not texts:
            return []
        limit = min(max_tokens, self.max_positions)
        return self.tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]

    def output_bounds(self, max_new: int, min_new: int) -> tuple[int, int]:
        """``(max_new, min_new)`` within the model's positions (the start token takes one)."""
        top = max(1, min(max_new, self.max_positions - 1))
        return top, min(min_new, top)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [t.strip() for t in self.tokenizer.batch_decode(ids, skip_special_tokens=True)]


class TransformersTranslator(_MarianText):
    def __init__(self, ref: ModelRef, settings: EngineSettings) -> None:
        import torch
        from transformers import AutoModelForSeq2SeqLM

        super().__init__(ref, settings)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if settings.device == "cpu":
            torch.set_num_threads(settings.threads)
        try:
            model = AutoModelForSeq2SeqLM.from_pretrained(
                ref.path, dtype=dtype[settings.compute_type], **hub_kwargs()
            )
        except OSError as exc:
            raise ConfigError(f"model {ref.spec!r} could not be loaded: {exc}") from None
        self.model = model.to(settings.device).eval()
        self.config = self.model.config
        from transformers import GenerationConfig

        # generate() fills unset fields from the model's shipped generation config; keep only
        # the special tokens there, so that nothing (Opus-MT: num_beams=4, max_length=512,
        # forced_eos_token_id) leaks into a decoding the params did not ask for. CTranslate2
        # forces no end token either: both engines then cut an unfinished output alike.
        self.model.generation_config = GenerationConfig(
            decoder_start_token_id=self.config.decoder_start_token_id,
            eos_token_id=self.config.eos_token_id,
            pad_token_id=self.pad_id,
        )

    def translate(
        self, batch: list[list[int]], decoding: Decoding, max_new: int, min_new: int, seed: int
    ) -> list[list[str]]:
        import torch
        from transformers import GenerationConfig

        if not batch:
            return []
        max_new, min_new = self.output_bounds(max_new, min_new)
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[row, : len(ids)] = 1
        n = decoding.n
        processors = []
        if decoding.stochastic:
            # Greedy over logits this module's sampler has reduced to its pick: each row draws
            # from its own stream (stages.backtranslate.sampling), whatever else is in the batch.
            input_ids = input_ids.repeat_interleave(n, dim=0)
            attention = attention.repeat_interleave(n, dim=0)
            processors.append(_SeededPick(row_seeds(seed, decoding, batch), max_new, decoding))
        config = GenerationConfig(
            decoder_start_token_id=self.config.decoder_start_token_id,
            eos_token_id=self.config.eos_token_id,
            pad_token_id=self.pad_id,
            suppress_tokens=[self.pad_id],
            max_new_tokens=max_new,
            min_new_tokens=min_new or None,
            do_sample=False,
            num_beams=decoding.beams if decoding.strategy == "beam" else 1,
            num_return_sequences=1 if decoding.stochastic else n,
            early_stopping=decoding.strategy == "beam",
        )
        device = self.settings.device
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=config,
                logits_processor=_processor_list(processors),
            )
        texts = self.decode(out.cpu().tolist())
        return [texts[i * n : (i + 1) * n] for i in range(len(batch))]


def _processor_list(processors: list):
    from transformers import LogitsProcessorList

    return LogitsProcessorList(processors)


class _SeededPick:
    """A logits processor that leaves only the token ``choose_tokens`` draws for each row, with
    the row's own uniforms; greedy search then takes it. Rows are the inputs repeated ``n``
    times, input-major, as ``row_seeds`` orders them."""

    def __init__(self, seeds: list[int], steps: int, decoding: Decoding) -> None:
        import torch

        self.u = torch.from_numpy(uniforms_table(seeds, steps))  # (rows, steps)
        self.decoding = decoding

    def __call__(self, input_ids, scores):
        import torch

        step = input_ids.shape[1] - 1  # the decoder start token is position 0
        picked = choose_tokens(scores, self.u[:, step], self.decoding).to(scores.device)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, picked.unsqueeze(1), 0.0)


class CTranslate2Translator(_MarianText):
    def __init__(self, ref: ModelRef, settings: EngineSettings) -> None:
        if settings.pins_cpu_isa:
            pin_cpu_isa(settings.cpu_isa)  # before anything imports ctranslate2
        import ctranslate2

        super().__init__(ref, settings)
        folder, _ = convert_ctranslate2(ref, settings.compute_type, settings.models_dir)
        options = {
            "device": settings.device,
            "compute_type": settings.compute_type,
            "intra_threads": settings.threads if settings.device == "cpu" else 0,
            "inter_threads": 1,
        }
        try:
            self.translator = ctranslate2.Translator(str(folder), **options)
        except ValueError as exc:  # "The CPU does not support AVX512"
            raise ConfigError(f"backtranslate.cpu_isa {settings.cpu_isa}: {exc}") from None
        self.vocabulary = _target_vocabulary(folder)
        self.end_index = self.vocabulary.index(self.tokenizer.eos_token)

    # Greedy tokens decoded past the sampled prefix per call of the sampler; their logits are
    # used while the drawn tokens follow them (see ``_sample``).
    window = 32

    def _logits(self, view):
        import numpy as np
        import torch

        if self.settings.device == "cuda":
            return torch.as_tensor(view, device="cuda")
        return torch.from_numpy(np.asarray(view))

    def translate(
        self, batch: list[list[int]], decoding: Decoding, max_new: int, min_new: int, seed: int
    ) -> list[list[str]]:
        if not batch:
            return []
        max_new, min_new = self.output_bounds(max_new, min_new)
        tokens = [self.tokenizer.convert_ids_to_tokens(ids) for ids in batch]
        options: dict[str, Any] = {
            "max_decoding_length": max_new,
            "min_decoding_length": min_new,
            "num_hypotheses": decoding.n,
        }
        if decoding.strategy == "greedy":
            options.update(beam_size=1, sampling_topk=1)
        elif decoding.strategy == "beam":
            options.update(beam_size=decoding.beams)
        else:
            return self._sample(batch, tokens, decoding, max_new, min_new, seed)
        results = self.translator.translate_batch(tokens, **options)
        out = []
        for result in results:
            hyps = [self.tokenizer.convert_tokens_to_ids(h) for h in result.hypotheses]
            out.append(self.decode(hyps))
        return out

    def _sample(
        self,
        batch: list[list[int]],
        tokens: list[list[str]],
        decoding: Decoding,
        max_new: int,
        min_new: int,
        seed: int,
    ) -> list[list[str]]:
        """Sampled decoding with this module's sampler: CTranslate2 computes the next-token
        logits of every unfinished row given the tokens chosen so far (``target_prefix``) and
        greedily decodes up to ``window`` tokens further; each position's token is drawn with
        the row's own uniform, and the greedy continuation's logits serve the next positions
        for as long as the drawn tokens equal the greedy ones (they are exact there)."""
        import torch

        # The sampler's tensors are small; torch's thread pool waking between CTranslate2's
        # calls only fights CTranslate2's own threads for the cores.
        torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._sample_rows(batch, tokens, decoding, max_new, min_new, seed)
        finally:
            torch.set_num_threads(torch_threads)

    def _sample_rows(
        self,
        batch: list[list[int]],
        tokens: list[list[str]],
        decoding: Decoding,
        max_new: int,
        min_new: int,
        seed: int,
    ) -> list[list[str]]:
        import torch

        n = decoding.n
        sources = [t for t in tokens for _ in range(n)]  # (rows,) input-major
        u = torch.from_numpy(uniforms_table(row_seeds(seed, decoding, batch), max_new))
        chosen: list[list[str]] = [[] for _ in sources]
        active = list(range(len(sources)))
        while active:
            longest = max(len(chosen[r]) for r in active)
            results = self.translator.translate_batch(
                [sources[r] for r in active],
                target_prefix=[chosen[r] for r in active],
                beam_size=1,
                max_decoding_length=min(max_new, longest + self.window),
                min_decoding_length=0,
                return_logits_vocab=True,
                return_end_token=True,
            )
            # Rows whose logits at their next position are in hand: (row, logits, greedy tokens).
            pending = [
                (r, res.logits[0], res.hypotheses[0])
                for r, res in zip(active, results, strict=True)
                # CTranslate2 translates an empty source (only the end token) to nothing,
                # greedy or sampled, and returns no logits for it.
                if res.logits or chosen[r]
            ]
            if any(len(logits) <= len(chosen[r]) for r, logits, _ in pending):
                raise RuntimeError("CTranslate2 returned no logits past the target prefix")
            active = []
            while pending:
                ready = [item for item in pending if len(chosen[item[0]]) < len(item[1])]
                active += [item[0] for item in pending if len(chosen[item[0]]) >= len(item[1])]
                if not ready:
                    break
                positions = [len(chosen[r]) for r, _, _ in ready]
                scores = torch.stack(
                    [
                        self._logits(logits[p])
                        for (_, logits, _), p in zip(ready, positions, strict=True)
                    ]
                )  # (rows, vocab)
                early = torch.tensor(positions) < min_new
                scores[early, self.end_index] = float("-inf")
                rows = torch.tensor([r for r, _, _ in ready])
                picks = choose_tokens(scores, u[rows, torch.tensor(positions)], decoding)
                pending = []
                for (r, logits, greedy), p, pick in zip(
                    ready, positions, picks.tolist(), strict=True
                ):
                    if pick == self.end_index:
                        continue
                    token = self.vocabulary[pick]
                    chosen[r].append(token)
                    if p + 1 >= max_new:
                        continue
                    if p < len(greedy) and greedy[p] == token:
                        pending.append((r, logits, greedy))  # the next logits are still exact
                    else:
                        active.append(r)
            active.sort()
        hyps = [self.tokenizer.convert_tokens_to_ids(c) for c in chosen]
        texts = self.decode(hyps)
        return [texts[i * n : (i + 1) * n] for i in range(len(batch))]


def pin_cpu_isa(wanted: str) -> str:
    """Make CTranslate2 run ``wanted`` CPU kernels in this process (``auto``: nothing to do);
    returns the ISA in effect (``auto`` when this CPU lacks ``wanted``).

    CTranslate2 reads ``CT2_FORCE_CPU_ISA`` partly when its library loads (a later value gets
    the ISA named in its log but some kernels stay the CPU's best), so this must run before
    ``ctranslate2`` is imported; afterwards it only checks. A CPU without the ISA (AVX2 on
    ARM, say) keeps its own best, with a warning: outputs may then differ from other machines.
    """
    if wanted == "auto" or os.environ.get("CT2_FORCE_CPU_ISA") == wanted:
        return wanted
    if not _cpu_has(wanted):
        log.warning(
            "backtranslate.cpu_isa %s: this CPU does not have it; CTranslate2 uses the CPU's "
            "best instead, so outputs may differ from machines that ran %s",
            wanted,
            wanted,
        )
        return "auto"
    if "ctranslate2" in sys.modules:
        raise ConfigError(
            f"cpu_isa {wanted}: CTranslate2 was loaded in this process before it "
            f"could apply; set CT2_FORCE_CPU_ISA={wanted} in the environment or run the stage "
            "in a fresh process"
        )
    os.environ["CT2_FORCE_CPU_ISA"] = wanted
    return wanted


def _cpu_has(isa: str) -> bool:
    machine = platform.machine().lower()
    if isa == "GENERIC":
        return True
    if isa == "NEON":
        return machine in ("arm64", "aarch64")
    if machine not in ("x86_64", "amd64"):
        return False
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return isa != "AVX512"  # every x86-64 Mac and Windows PC of the last decade has AVX2
    flags = set(cpuinfo.read_text().split())
    return {"AVX": "avx", "AVX2": "avx2", "AVX512": "avx512f"}[isa] in flags


def _target_vocabulary(folder) -> list[str]:
    """The converted model's target tokens in CTranslate2's index order."""
    for name in ("target_vocabulary", "shared_vocabulary"):
        path = folder / f"{name}.json"
        if path.exists():
            return json.loads(path.read_text(encoding="utf-8"))
        path = folder / f"{name}.txt"
        if path.exists():
            return path.read_text(encoding="utf-8").split("\n")[:-1]
    raise ConfigError(f"CTranslate2 model {folder} has no target vocabulary file")


@functools.lru_cache(maxsize=16)
def load_translator(ref: ModelRef, settings: EngineSettings) -> Translator:
    """A loaded translator, once per process for each (model, engine settings)."""
    if settings.engine == "apertium":
        return ApertiumTranslator(ref, settings)
    cls = CTranslate2Translator if settings.engine == "ctranslate2" else TransformersTranslator
    return cls(ref, settings)


class TranslatorPool:
    """The translators a shard needs, by model spec; picklable (models load in each process)."""

    def __init__(self, refs: dict[str, ModelRef], settings: EngineSettings) -> None:
        self.refs = dict(refs)
        self.settings = settings
        self._loaded: dict[str, Translator] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"refs": self.refs, "settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["refs"], state["settings"])

    def get(self, spec: str) -> Translator:
        if spec not in self._loaded:
            self._loaded[spec] = load_translator(self.refs[spec], self.settings)
        return self._loaded[spec]
