"""The ingest stage: every input format, the bad-input quarantine, dedup, accounting."""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.pipeline.plumbing.shards import open_dataset
from pairforge.pipeline.science.text import sentence_id
from pairforge.stages.ingest.stage import Deduplicator, IngestConfig, run

GOOD = [
    "The museum closes at six on weekdays.",
    "On weekdays the museum shuts its doors at 6 pm.",
    "The train to Leeds leaves at nine every morning.",
    "The train to Leeds never leaves at nine in the morning.",
    "Fresh basil should be added at the very end of cooking.",
]


def ingest(tmp_path, inputs, **overrides):
    cfg = IngestConfig(
        root=str(tmp_path),
        inputs=inputs,
        output=str(tmp_path / "out" / "sentences"),
        quarantine=str(tmp_path / "out" / "quarantine"),
        metrics=str(tmp_path / "out" / "metrics.json"),
        **overrides,
    )
    metrics = run(cfg, LocalExecutor(), progress=False)
    sentences = open_dataset(cfg.output, S.SENTENCES, verify=True).read_table()
    quarantine = open_dataset(cfg.quarantine, S.QUARANTINE, verify=True).read_table()
    return metrics, sentences, quarantine


def write_formats(tmp_path) -> dict[str, str]:
    (tmp_path / "a.txt").write_text("\n".join(GOOD) + "\n")
    with gzip.open(tmp_path / "a.txt.gz", "wt") as fh:
        fh.write("\n".join(GOOD))
    jsonl = "".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(GOOD))
    (tmp_path / "a.jsonl").write_text(jsonl)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as fh:
        fh.write(jsonl)
    for name, delim in (("a.csv", ","), ("a.tsv", "\t")):
        with open(tmp_path / name, "w", newline="") as fh:
            writer = csv.writer(fh, delimiter=delim)
            writer.writerow(["n", "text"])
            writer.writerows([[i, t] for i, t in enumerate(GOOD)])
    pq.write_table(pa.table({"n": list(range(5)), "text": GOOD}), tmp_path / "a.parquet")
    return {
        "txt": "a.txt",
        "txt.gz": "a.txt.gz",
        "jsonl": "a.jsonl",
        "jsonl.gz": "a.jsonl.gz",
        "csv": "a.csv",
        "tsv": "a.tsv",
        "parquet": "a.parquet",
    }


@pytest.mark.parametrize("fmt", ["txt", "txt.gz", "jsonl", "jsonl.gz", "csv", "tsv", "parquet"])
def test_every_input_format(tmp_path, fmt):
    name = write_formats(tmp_path)[fmt]
    metrics, sentences, quarantine = ingest(tmp_path, [name])
    assert sentences[S.TEXT].to_pylist() == GOOD
    assert sentences[S.ID].to_pylist() == [sentence_id(t) for t in GOOD]
    assert set(sentences[S.SOURCE].to_pylist()) == {str(tmp_path / name)}
    expected_lines = [2, 3, 4, 5, 6] if fmt in ("csv", "tsv") else [1, 2, 3, 4, 5]
    assert sentences[S.LINE].to_pylist() == expected_lines
    assert metrics["rows_read"] == 5 and metrics["rows_kept"] == 5 and quarantine.num_rows == 0


def test_several_files_and_globs_dedup_across_files(tmp_path):
    write_formats(tmp_path)
    metrics, sentences, quarantine = ingest(
        tmp_path, ["a.*", "a.txt"], rows_per_shard=2, chunk_rows=3
    )
    assert sentences[S.TEXT].to_pylist() == GOOD  # first occurrence wins, order kept
    assert metrics["rows_read"] == 35
    assert metrics["rows_dropped"]["duplicate"] == 30
    assert quarantine.num_rows == 30
    assert metrics["shards"] == 3


def test_explicit_format_overrides_suffix(tmp_path):
    (tmp_path / "corpus.data").write_text("\n".join(GOOD))
    with pytest.raises(ConfigError, match="cannot tell the format"):
        ingest(tmp_path, ["corpus.data"])
    _, sentences, _ = ingest(tmp_path, ["corpus.data"], format="txt")
    assert sentences.num_rows == 5


def test_missing_inputs_and_columns_are_config_errors(tmp_path):
    write_formats(tmp_path)
    with pytest.raises(ConfigError, match=r"nope/\*.txt' matches no file"):
        ingest(tmp_path, ["nope/*.txt"])
    with pytest.raises(ConfigError, match="column 'body' not in .*a.csv"):
        ingest(tmp_path, ["a.csv"], field="body")
    with pytest.raises(ConfigError, match="column 'body' not in .*a.parquet"):
        ingest(tmp_path, ["a.parquet"], field="body")


BAD_EXPECTED = {
    "invalid_utf8": 2,
    "nul_byte": 2,
    "empty": 4,
    "too_short": 2,
    "too_long": 2,
    "duplicate": 3,
    "malformed_record": 0,
}


def write_bad_corpus(tmp_path) -> None:
    one_mb = ("lorem ipsum " * 90_000)[:1_000_000].encode()
    lines = [
        GOOD[0].encode() + b"\r\n",  # BOM prepended below; CRLF
        GOOD[1].encode() + b"\n",
        b"caf\xe9 au lait is served warm every morning\n",  # latin-1, not UTF-8
        b"a truncated sequence \xe2\x82 in this line\r",  # lone CR newline
        b"a NUL\x00 byte inside a sentence\n",
        b"\x00\x00\x00\x00\n",
        b"\n",
        b"   \t  \r\n",
        b"\r",
        b"\xe3\x80\x80\xc2\xa0\n",  # ideographic space, no-break space: whitespace only
        b"Hello.\n",
        b"Yes indeed\n",
        one_mb + b"\n",  # 1 MB: decoded, too many words/chars
        b"x" * 3_000_000 + b"\n",  # over max_line_bytes: never held whole
        GOOD[0].encode() + b"\n",  # exact duplicate
        b"  The museum   closes at six\ton weekdays.  \n",  # duplicate after normalisation
        b"The bell\x07 rang twice\x1b before the class started.\n",  # control chars: kept
        "Cafe\u0301 culture in Lisbon is older than the trams.\n".encode(),  # NFD -> NFC
        "Café culture in Lisbon is older than the trams.".encode(),  # NFC: duplicate; no final newline
    ]
    (tmp_path / "bad.txt").write_bytes(b"\xef\xbb\xbf" + b"".join(lines))


def test_bad_input_counts_every_reason_exactly(tmp_path):
    write_bad_corpus(tmp_path)
    metrics, sentences, quarantine = ingest(
        tmp_path, ["bad.txt"], max_line_bytes=2_000_000, chunk_rows=4
    )
    assert metrics["rows_read"] == 19
    assert metrics["rows_dropped"] == BAD_EXPECTED
    assert metrics["rows_kept"] == 4
    assert metrics["rows_read"] == metrics["rows_kept"] + metrics["rows_dropped_total"]
    assert sentences[S.TEXT].to_pylist() == [
        GOOD[0],  # the BOM is gone
        GOOD[1],
        "The bell rang twice before the class started.",
        "Café culture in Lisbon is older than the trams.",
    ]
    assert sentences[S.LINE].to_pylist() == [1, 2, 17, 18]
    by_line = {row["line"]: row for row in quarantine.to_pylist()}
    assert by_line[3]["reason"] == "invalid_utf8" and "\ufffd" in by_line[3]["text"]
    assert by_line[14]["reason"] == "too_long" and by_line[14]["n_bytes"] == 3_000_000
    assert len(by_line[14]["text"]) <= 1000  # a preview, never the whole line
    assert by_line[13]["n_bytes"] == 1_000_000 and len(by_line[13]["text"]) <= 500
    assert by_line[16]["reason"] == "duplicate" and sentence_id(GOOD[0]) in by_line[16]["detail"]
    assert by_line[19]["reason"] == "duplicate"
    assert sorted(by_line) == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19]


def test_invalid_utf8_can_be_repaired_instead(tmp_path):
    write_bad_corpus(tmp_path)
    metrics, sentences, _ = ingest(
        tmp_path, ["bad.txt"], invalid_utf8="replace", max_line_bytes=2_000_000
    )
    assert metrics["rows_dropped"]["invalid_utf8"] == 0
    assert "caf\ufffd au lait is served warm every morning" in sentences[S.TEXT].to_pylist()


def test_jsonl_and_csv_record_errors_are_quarantined(tmp_path):
    (tmp_path / "x.jsonl").write_bytes(
        b'{"text": "A perfectly fine sentence is here."}\n'
        b'{"text": 42}\n'
        b'{"body": "no text field in this one"}\n'
        b'{"text": "truncated\n'
        b'["a", "list"]\n'
        b'{"text": "lone surrogate \\ud800 inside this one"}\n'
        b"\n"
    )
    metrics, sentences, quarantine = ingest(tmp_path, ["x.jsonl"])
    assert sentences.num_rows == 1
    assert metrics["rows_dropped"]["malformed_record"] == 4
    assert metrics["rows_dropped"]["invalid_utf8"] == 1
    assert metrics["rows_dropped"]["empty"] == 1
    details = dict(
        zip(quarantine[S.LINE].to_pylist(), quarantine[S.DETAIL].to_pylist(), strict=False)
    )
    assert details[2] == "field 'text' is int, not a string"
    assert details[3] == "no field 'text'"
    assert details[4].startswith("invalid JSON")

    (tmp_path / "x.csv").write_bytes(
        b'id,text\n1,A perfectly fine sentence is here.\n2\n3,"multi\nline value here ok"\n'
    )
    metrics, sentences, quarantine = ingest(tmp_path, ["x.csv"])
    assert sentences[S.TEXT].to_pylist() == [
        "A perfectly fine sentence is here.",
        "multi line value here ok",
    ]
    assert quarantine[S.REASON].to_pylist() == ["malformed_record"]


def test_accounting_is_checked_and_metrics_written(tmp_path):
    write_formats(tmp_path)
    metrics, _, _ = ingest(tmp_path, ["a.txt", "a.jsonl"])
    on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert on_disk == metrics
    assert set(on_disk["rows_dropped"]) == set(BAD_EXPECTED)


def test_rerun_with_same_inputs_does_no_work(tmp_path, monkeypatch):
    write_formats(tmp_path)
    first = ingest(tmp_path, ["a.txt"])
    import pairforge.stages.ingest.stage as ingest_module

    def boom(*args, **kwargs):
        raise AssertionError("a finished dataset was recomputed")

    monkeypatch.setattr(ingest_module, "read_chunks", boom)
    monkeypatch.setattr(ingest_module, "clean_shard", boom)
    second = ingest(tmp_path, ["a.txt"])
    assert second[0] == first[0] and second[1].equals(first[1])


def test_changed_params_recompute(tmp_path):
    write_formats(tmp_path)
    _, short, _ = ingest(tmp_path, ["a.txt"])
    _, strict, quarantine = ingest(tmp_path, ["a.txt"], min_words=10)
    assert short.num_rows == 5 and strict[S.TEXT].to_pylist() == [GOOD[1], GOOD[3], GOOD[4]]
    assert quarantine[S.REASON].to_pylist() == ["too_short"] * 2
    assert quarantine[S.DETAIL].to_pylist() == ["7 words < min_words=10", "9 words < min_words=10"]


def test_deduplicator_keeps_first_occurrence_across_chunks():
    dedup = Deduplicator()
    a = dedup.keep_mask(np.array([5, 3, 5, 9], dtype="uint64"))
    b = dedup.keep_mask(np.array([9, 1, 3, 1, 2**64 - 1], dtype="uint64"))
    assert a.tolist() == [True, True, False, True]
    assert b.tolist() == [False, True, False, False, True]
    assert dedup.seen.tolist() == sorted([1, 3, 5, 9, 2**64 - 1])
