"""standin: build the tiny stand-in translation models the offline demo back-translates with.

No real Opus-MT model can be downloaded offline, so the demo profile builds one MarianMT folder
per language pair (``<output>/opus-mt-en-zh``, ...) from the ingested sentences: a sentencepiece
vocabulary trained on them and weights set by construction (see ``stages.standin.marian``).
They copy their input with seeded substitutions from a hand-written synonym table
(``stages.standin.synonyms``); they do not translate.
Each folder carries ``pairforge-standin.json`` saying so, and ``backtranslate`` records that in
the candidates manifest and metrics.

The paper profile sets ``enabled: false``: the stage then writes only a README into ``output``
(so that DVC has an output) and the backtranslate stage uses the real Opus-MT hub models.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.config import StageConfig
from pairforge.pipeline.plumbing.errors import PairforgeError
from pairforge.pipeline.plumbing.files import apply_umask, atomic_write_json
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.plumbing.stagedefs import StageDef
from pairforge.pipeline.plumbing.stagerun import StageRun
from pairforge.stages.options import stage_command
from pairforge.stages.standin.marian import NOTE, build_standins
from pydantic import Field

log = logging.getLogger("pairforge")


class StandinConfig(StageConfig):
    """The ``standin`` section of params.yaml."""

    enabled: bool = Field(
        True,
        description="build the models; false: build nothing but a README (real models are used)",
    )
    input: str = Field(
        "data/sentences", description="sentences dataset the vocabulary is trained on"
    )
    output: str = Field(
        "data/models/standin", description="folder that receives one opus-mt-<pair> folder per pair"
    )
    pairs: list[str] = Field(
        default_factory=lambda: ["en-zh", "zh-en", "en-de", "de-en", "en-fr", "fr-en"],
        description="language pairs such as en-zh, one model folder opus-mt-<pair> each (on the command line: repeat --pair)",
    )
    vocab_size: int = Field(
        4000, ge=100, description="sentencepiece pieces (fewer if the corpus is small)"
    )
    synonyms: str | None = Field(
        "builtin",
        description="substitution table: builtin (stages/standin/synonyms.py), a TSV file of "
        "word<TAB>substitute lines, or null for exact copies",
    )
    substitute_rate: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="share of the table's words each model replaces under greedy decoding",
    )
    sharpness: float = Field(
        4.0, gt=0.0, description="logit scale: lower makes sampling substitute more"
    )
    seed: int = Field(0, description="seed of the vocabulary and of each model")


STAGE = StageDef(
    name="standin",
    module=__name__,
    config=StandinConfig,
    inputs=("${standin.input}",),
    outputs=("output",),
    models=("output",),
    outs={
        "${standin.output}": {},
    },
)


def _build(cfg: StandinConfig, folder: Path) -> tuple[dict, str]:
    if not cfg.enabled:
        return {}, (
            "# Stand-in translation models\n\nDisabled in this profile "
            "(`standin.enabled: false`); the backtranslate stage uses real models.\n"
        )
    texts = open_dataset(cfg.input, S.SENTENCES).read_table([S.TEXT])[S.TEXT].to_pylist()
    if not texts:
        raise PairforgeError(
            f"standin: dataset {cfg.input!r} has no sentences to build a vocabulary from"
        )
    written = build_standins(
        texts,
        folder,
        cfg.pairs,
        vocab_size=cfg.vocab_size,
        synonyms=cfg.synonyms,
        substitute_rate=cfg.substitute_rate,
        sharpness=cfg.sharpness,
        seed=cfg.seed,
    )
    return written, f"# Stand-in translation models\n\n{NOTE}\n\nPairs: {', '.join(cfg.pairs)}.\n"


def run(cfg: StandinConfig) -> dict:
    """Build (or, disabled, describe) the stand-in models into ``cfg.output``, replacing what
    was there only once the new folder is complete; returns each model's stand-in note."""
    out = Path(cfg.output)
    with StageRun(STAGE, cfg) as run:
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            written, readme = _build(cfg, tmp)
            (tmp / "README.md").write_text(readme)
            atomic_write_json(tmp / "standin.json", {"enabled": cfg.enabled, "models": written})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        apply_umask(tmp)  # safetensors writes 0600
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    if cfg.enabled:
        log.info(
            "standin: built %d stand-in models (NOT translation models) under %s in %.1fs",
            len(written),
            out,
            run.seconds,
        )
    else:
        log.info("standin: disabled; wrote only %s/README.md", out)
    return written


@stage_command(STAGE, names={"enabled": ("--enabled/--disabled",), "pairs": ("--pair",)})
def command(cfg: StandinConfig) -> None:
    """Build tiny stand-in MarianMT models for the offline demo (they copy with word
    substitutions; they do NOT translate).

    Every option defaults to the key of the same name in the `standin` section of params.yaml.
    """
    run(cfg)
