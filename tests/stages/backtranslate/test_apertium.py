"""The Apertium engine on the real binary (Debian's apertium, apertium-eng-spa, apertium-eng-cat,
apertium-eo-en; ``.ci/run`` installs them): alignment, awkward inputs, the stage end to end,
rerun and kill-and-resume byte identity, and one-line errors when a binary or pair is missing.

Outside CI a machine without Apertium skips the tests that run it; in CI they fail instead."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.models.apertium import mode_problem
from pairforge.pipeline.science.models.files import resolve_translation_model
from pairforge.stages.backtranslate.apertium import (
    ApertiumError,
    ApertiumPipeline,
    decode_block,
    encode_block,
)
from pairforge.stages.backtranslate.stage import BacktranslateConfig
from pairforge.stages.profile import profile_params

from tests.conftest import ROOT, run_cli
from tests.faults import KILLED
from tests.stages.augment_helpers import write_params, write_sentences

MODES = ("apertium:eng-spa", "apertium:spa-eng", "apertium:eng-cat", "apertium:cat-eng",
         "apertium:en-eo", "apertium:eo-en")  # fmt: skip
MISSING = next((p for p in map(mode_problem, MODES) if p), None)
needs_apertium = pytest.mark.skipif(
    MISSING is not None and not os.environ.get("CI"),
    reason=f"Apertium is not installed here ({MISSING}); CI installs it",
)
ROUTES = [
    {"name": "en-es-en", "forward": "apertium:eng-spa", "backward": "apertium:spa-eng"},
    {"name": "en-ca-en", "forward": "apertium:eng-cat", "backward": "apertium:cat-eng"},
    {"name": "en-eo-en", "forward": "apertium:en-eo", "backward": "apertium:eo-en"},
]
AWKWARD = [
    "",  # an empty line
    "The committee approved the budget after a long debate. " * 36,  # ~2,000 characters
    "Москва — столица России, 東京は日本の首都です, and Αθήνα is in Greece.",
    "Rate it *five* stars #winning @everyone ^^ $5 [note] {x} a/b \\ <tag> ~tilde",
    "%%% ### @@@ *** ~~~ ... ---",  # nothing Apertium can analyse as words
    "😀 🚀 ∑∫√ \u200b zzqxj vvkrw",
    "I have a big",  # with the next line, words that a line-based batch moves across lines
    "cat house",
]


def spa(persistent: bool = True) -> ApertiumPipeline:
    return ApertiumPipeline(Path(resolve_translation_model("apertium:eng-spa").path), persistent)


# --- the stream format (no binary) ----------------------------------------------------------


def test_blocks_escape_frame_and_decode():
    block, added = encode_block(7, "A [b] {c} ^d$ e/f \\g <h> @i ~j  k\tl")
    assert block == "[7]A \\[b\\] \\{c\\} \\^d\\$ e\\/f \\\\g \\<h\\> \\@i [~]j k l.[]"
    assert added
    assert encode_block(0, "Ends with a period.") == ("[0]Ends with a period.[]", False)
    # The pipeline's output of a block, decoded: escapes and blanks resolved, the added period
    # taken off, a period of the sentence's own kept.
    assert decode_block(" [7]Un \\[b\\] [~]j.[]", 7, True) == "Un [b] ~j"
    assert decode_block("[0]Termina con un punto.[]", 0, False) == "Termina con un punto."
    with pytest.raises(ApertiumError, match="block 3: expected it to start with '\\[3\\]'"):
        decode_block("[4]Otro.[]", 3, True)


def test_a_pipeline_that_loses_a_block_or_swaps_two_is_an_error(tmp_path):
    """Any program that breaks the block order is caught by the index check, never written."""
    mode = tmp_path / "fake.mode"
    mode.write_text("cat\n")
    swap = (
        "import sys; b = sys.stdin.buffer.read().split(b'\\0'); b[0], b[1] = b[1], b[0]; "
        "sys.stdout.buffer.write(b'\\0'.join(b))"
    )
    drop = "import sys; b = sys.stdin.buffer.read().split(b'\\0'); sys.stdout.buffer.write(b'\\0'.join(b[1:]))"
    for script, message in ((swap, "block 0: expected"), (drop, "of 3 blocks came back|block 0")):
        fake = _FakePipeline(mode, f'{sys.executable} -c "{script}"')
        with pytest.raises(ApertiumError, match=message):
            fake.translate(["one.", "two.", "three."])
    ok = _FakePipeline(mode, "cat")
    assert ok.translate(["one", "two [x]", ""]) == ["one", "two [x]", ""]


class _FakePipeline(ApertiumPipeline):
    """The pipeline machinery around another command (per batch: it reads to end of input)."""

    def __init__(self, mode_path: Path, command: str) -> None:
        import weakref

        self.mode_path, self.command, self.persistent = mode_path, command, False
        self._proc, self._stderr = None, None
        self._finalizer = weakref.finalize(self, ApertiumPipeline._stop_process, [None])


# --- the real binary --------------------------------------------------------------------------


@needs_apertium
def test_awkward_inputs_come_back_aligned_and_equal_to_one_at_a_time():
    pipeline = spa()
    batch = pipeline.translate(AWKWARD)
    alone = [pipeline.translate([text])[0] for text in AWKWARD]
    assert batch == alone  # nothing of one sentence reaches another
    assert len(batch) == len(AWKWARD)
    assert batch[0] == ""
    assert 1500 < len(batch[1]) < 3000 and batch[1].count("comité") == 36
    assert "Москва" in batch[2] and "東京は日本の首都です" in batch[2]
    assert "*five*" in batch[3] or "*cinco*" in batch[3]
    for kept in ("#", "@", "^^ $5", "[nota]", "{x}", "\\", "<etiqueta>", "~tilde"):
        assert kept in batch[3]  # escaped on the way in, unescaped on the way out
    assert batch[4].startswith("%%% ### @@@")
    assert "😀 🚀" in batch[5] and "zzqxj" in batch[5]  # unknown words copied, unmarked
    assert "*zzqxj" not in batch[5]
    assert "gato" not in batch[6] and "gato" in batch[7]
    # The round trip: the same texts back to English, aligned too.
    back = ApertiumPipeline(Path(resolve_translation_model("apertium:spa-eng").path))
    english = back.translate(batch)
    assert english[0] == "" and len(english) == len(AWKWARD)
    assert english == [back.translate([t])[0] for t in batch]


@needs_apertium
def test_one_process_per_batch_gives_the_same_translations():
    texts = [f"The river {i} runs past the old mill." for i in range(50)] + AWKWARD
    assert spa(persistent=True).translate(texts) == spa(persistent=False).translate(texts)


@needs_apertium
def test_the_mode_revision_is_a_content_hash():
    ref = resolve_translation_model("apertium:eng-spa")
    assert ref.path.endswith("eng-spa.mode") and ref.local
    assert ref.revision.startswith("sha256:") and len(ref.revision) == 23
    assert ref.revision != resolve_translation_model("apertium:spa-eng").revision
    with pytest.raises(ConfigError, match="revision applies to hub ids"):
        resolve_translation_model("apertium:eng-spa", revision="main")


def corpus_texts() -> list[str]:
    return [
        "The old bridge was closed for repairs last winter.",
        "She plays the violin in the city orchestra.",
        "Rain fell on the village for three days.",
        "The museum opened a new wing for modern art.",
        "Farmers brought their apples to the market.",
        "He wrote the letter by hand and posted it.",
        "The train to the coast leaves at noon.",
        "A small boat drifted towards the harbour.",
        "Children were playing football in the park.",
        "The library lends books, maps and music.",
        "Our teacher explained the theory with a drawing.",
        "The storm knocked down two trees near the school.",
    ]


def project(path: Path, **overrides) -> Path:
    write_sentences(path / "data/sentences", corpus_texts(), rows_per_shard=4)
    section = {
        "engine": "apertium",
        "max_batch_sentences": 5,
        "routes": [dict(ROUTES[0], noise=True), *ROUTES[1:]],
        "noise": {"copies": 2, "vocabulary": ["the", "of", "and"], "mask_token": ""},
        **overrides,
    }
    write_params(path / "params.yaml", {"backtranslate": section})
    return path


def snapshot(path: Path) -> dict:
    out = path / "data/candidates"
    manifest = json.loads((out / "_manifest.json").read_text())
    files = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.glob("data/part-*.parquet")
    }
    return {"files": files, "rows": manifest["rows"], "fingerprint": manifest["fingerprint"]}


@needs_apertium
def test_the_stage_writes_candidates_for_three_routes_and_reruns_byte_identical(tmp_path):
    first = project(tmp_path / "a")
    result = run_cli(["backtranslate", "--no-progress"], cwd=first)
    assert result.returncode == 0, result.stderr
    df = pl.read_parquet(first / "data/candidates/data/*.parquet")
    # en-es-en: each sentence and its 2 noised copies; the other routes: the sentence.
    assert df.height == 12 * 3 + 12 + 12
    assert set(df["route"]) == {"en-es-en", "en-ca-en", "en-eo-en"}
    assert set(df["engine"]) == {"apertium"} and set(df["decoding"]) == {"greedy"}
    assert set(df["model"]) == {
        "apertium:eng-spa+apertium:spa-eng",
        "apertium:eng-cat+apertium:cat-eng",
        "apertium:en-eo+apertium:eo-en",
    }
    clean = df.filter(pl.col("noise") == "none")
    assert clean.filter(pl.col("route") == "en-es-en")["pivot"].str.contains("tren").any()
    assert clean.filter(pl.col("route") == "en-ca-en")["pivot"].str.contains("tren").any()
    assert clean.filter(pl.col("route") == "en-eo-en")["pivot"].str.contains("trajno").any()
    masked = df.filter(pl.col("noise").str.starts_with("mask"))
    assert masked.height > 0 and not masked["noised_text"].str.contains("<unk>").any()
    assert not df["text"].str.contains("<unk>").any()
    assert (df["text"].str.len_chars() > 10).all()
    manifest = json.loads((first / "data/candidates/_manifest.json").read_text())
    assert manifest["engine"]["engine"] == "apertium" and manifest["standin"] is None
    assert manifest["models"]["apertium:eng-spa"]["revision"].startswith("sha256:")
    metrics = json.loads((first / "metrics/backtranslate.json").read_text())
    assert metrics["standin"] is False and metrics["candidates_out"] == df.height

    second = project(tmp_path / "b")
    result = run_cli(["backtranslate", "--no-progress"], cwd=second)
    assert result.returncode == 0, result.stderr
    assert snapshot(second) == snapshot(first)


@pytest.mark.slow
@needs_apertium
def test_killed_mid_shard_resumes_byte_identical(tmp_path):
    clean = project(tmp_path / "clean")
    assert run_cli(["backtranslate", "--no-progress"], cwd=clean).returncode == 0
    killed = project(tmp_path / "killed")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DVC_NO_ANALYTICS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults", "cache:1", "--", "backtranslate", "--no-progress"],
        cwd=killed,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == KILLED, proc.stderr[-2000:]
    done = sorted(p.name for p in (killed / "data/candidates/_progress").glob("part-*.json"))
    assert done == ["part-00000.json"]
    resumed = run_cli(["backtranslate"], cwd=killed)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 shards already finished, skipped" in resumed.stderr
    assert snapshot(killed) == snapshot(clean)


# --- configuration and missing installs --------------------------------------------------------


def test_engine_and_specs_must_agree_and_decodings_be_greedy():
    def cfg(**kw):
        return BacktranslateConfig.model_validate({"routes": ROUTES[:1], **kw})

    assert cfg(engine="apertium").engine == "apertium"
    with pytest.raises(ValueError, match="is an Apertium mode: set engine: apertium"):
        cfg(engine="ctranslate2")
    with pytest.raises(ValueError, match="engine apertium translates with apertium:<mode>"):
        BacktranslateConfig.model_validate(
            {
                "engine": "apertium",
                "routes": [{"name": "en-de-en", "forward": "a", "backward": "b"}],
            }
        )
    sampled = dict(ROUTES[0], decodings=[{"strategy": "greedy"}, {"strategy": "sample", "n": 2}])
    with pytest.raises(ValueError, match="one translation per input"):
        BacktranslateConfig.model_validate({"engine": "apertium", "routes": [sampled]})


def test_a_missing_binary_or_pair_is_one_line_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apertium on it
    assert "`apt-get install apertium`" in mode_problem("apertium:eng-spa")
    path = project(tmp_path / "p")
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pairforge.stages.cli", "backtranslate"],
        cwd=path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "error: backtranslate.routes.0.forward: 'apertium:eng-spa': the `apertium` program is "
        "not installed: `apt-get install apertium` (apt-get install apertium apertium-eng-spa "
        "apertium-eng-cat apertium-eo-en)"
    ], result.stderr
    # `profile check` finds it before any work: the apertium profile, on this machine.
    check = subprocess.run(
        [sys.executable, "-m", "pairforge.stages.cli", "profile", "check", "apertium"],
        cwd=path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 2
    assert check.stderr.startswith("error: backtranslate.routes.0.forward: 'apertium:eng-spa'")
    assert "apt-get install apertium" in check.stderr


@needs_apertium
def test_a_pair_that_is_not_installed_names_what_to_install(tmp_path):
    assert mode_problem("apertium:eng-spa") is None
    assert mode_problem("apertium:fra-xxx") == (
        "Apertium mode 'fra-xxx' is not installed: install the Apertium pair that has mode "
        "'fra-xxx' (Debian: apertium-fra-xxx or apertium-xxx-fra; `apertium -l` lists the "
        "installed modes)"
    )
    assert "is not an Apertium mode name" in mode_problem("apertium:../../etc/passwd")
    params = profile_params("apertium")
    params["backtranslate"]["routes"][0]["backward"] = "apertium:spa-xxx"
    write_params(tmp_path / "params.yaml", params)
    result = run_cli(["profile", "check", "params.yaml"], cwd=tmp_path)
    assert result.returncode == 2
    assert "backtranslate.routes.0.backward: 'apertium:spa-xxx': Apertium mode" in result.stderr


@needs_apertium
@pytest.mark.slow
def test_dask_workers_write_the_bytes_of_the_in_process_run(tmp_path):
    """Two Dask worker processes, each with its own long-lived pipelines, write what one
    process writes."""
    alone = project(tmp_path / "alone")
    assert run_cli(["backtranslate", "--no-progress"], cwd=alone).returncode == 0
    spread = project(tmp_path / "spread")
    result = run_cli(["backtranslate", "--no-progress", "--workers", "2"], cwd=spread, timeout=600)
    assert result.returncode == 0, result.stderr
    assert snapshot(spread) == snapshot(alone)
