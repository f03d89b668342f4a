"""Ordinary bad input files: empty, 0-byte or corrupt Parquet, truncated gzip, unterminated CSV
quotes. Each ends in one line naming the file (exit code as documented) or in counted quarantine
rows, and ``rows_read == rows_kept + rows_dropped_total`` stays exact."""

from __future__ import annotations

import gzip
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.pipeline.science.readers import InputError
from pairforge.stages.cli import app
from typer.testing import CliRunner

from tests.conftest import run_cli
from tests.stages.ingest.test_ingest import GOOD, ingest

runner = CliRunner()


def cli_ingest(tmp_path, inputs: list[str]):
    """``pairforge ingest`` in-process; returns (exit code, stderr lines, metrics or None)."""
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "ingest": {
                    "root": str(tmp_path),
                    "inputs": inputs,
                    "output": str(tmp_path / "out" / "sentences"),
                    "quarantine": str(tmp_path / "out" / "quarantine"),
                    "metrics": str(tmp_path / "out" / "metrics.json"),
                }
            }
        )
    )
    # The CLI logs to the stderr it finds first; CliRunner swaps stderr on every call.
    logger = logging.getLogger("pairforge")
    logger.handlers.clear()
    try:
        result = runner.invoke(
            app, ["ingest", "--params", str(tmp_path / "params.yaml"), "--no-progress"]
        )
    finally:
        logger.handlers.clear()
        logger.propagate = True
    errors = [line for line in result.stderr.splitlines() if not line[:2].isdigit()]
    metrics_path = tmp_path / "out" / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else None
    return result.exit_code, errors, metrics


def balanced(metrics: dict) -> bool:
    return metrics["rows_read"] == metrics["rows_kept"] + metrics["rows_dropped_total"]


@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl", "empty.csv", "empty.txt.gz"])
def test_a_corpus_of_only_empty_files_is_one_line_exit_2(tmp_path, name):
    if name.endswith(".gz"):
        (tmp_path / name).write_bytes(gzip.compress(b""))
    else:
        (tmp_path / name).write_bytes(b"")
    code, errors, metrics = cli_ingest(tmp_path, [name])
    assert code == 2 and metrics is None
    assert errors == [
        f"error: ingest.inputs: no rows read from any input (1 file(s), all empty: "
        f"{tmp_path / name}); point ingest.inputs at the corpus"
    ]


def test_empty_files_among_others_give_zero_rows(tmp_path, caplog):
    for name in ("empty.txt", "empty.jsonl", "empty.csv"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "a.txt").write_text("\n".join(GOOD) + "\n")
    metrics, sentences, quarantine = ingest(
        tmp_path, ["empty.txt", "a.txt", "empty.jsonl", "empty.csv"]
    )
    assert sentences[S.TEXT].to_pylist() == GOOD and quarantine.num_rows == 0
    assert metrics["rows_read"] == 5 and balanced(metrics)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        f"ingest: {tmp_path / n} is empty: no rows read from it"
        for n in ("empty.txt", "empty.jsonl", "empty.csv")
    ]


@pytest.mark.parametrize(
    ("content", "state"),
    [
        (b"", "empty (0 bytes)"),
        (b"PAR1 this is not a parquet file at all", "corrupt or not Parquet"),
    ],
)
def test_unreadable_parquet_is_one_line_naming_the_file(tmp_path, content, state):
    (tmp_path / "a.txt").write_text("\n".join(GOOD) + "\n")
    (tmp_path / "bad.parquet").write_bytes(content)
    code, errors, metrics = cli_ingest(tmp_path, ["a.txt", "bad.parquet"])
    assert code == 1 and metrics is None
    assert len(errors) == 1
    assert errors[0].startswith(
        f"error: {tmp_path / 'bad.parquet'}: cannot read it as Parquet: the file is {state}"
    )
    assert errors[0].endswith("write it again or drop it from ingest.inputs")


def test_parquet_corrupt_inside_names_the_row(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": GOOD * 40}), path, row_group_size=50, compression="none")
    data = bytearray(path.read_bytes())
    # Overwrite the data pages of the later row groups, keep the header and footer intact.
    footer = int.from_bytes(data[-8:-4], "little") + 8
    start = len(data) // 2
    data[start : len(data) - footer - 8] = b"\xff" * (len(data) - footer - 8 - start)
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"a\.parquet: the Parquet data is corrupt after row \d+"):
        ingest(tmp_path, ["a.parquet"])


def test_truncated_gzip_is_one_line_not_aborted(tmp_path):
    text = "".join(f"Sentence number {i} of the gzipped corpus.\n" for i in range(50_000))
    packed = gzip.compress(text.encode())
    (tmp_path / "cut.txt.gz").write_bytes(packed[: len(packed) * 3 // 4])
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"ingest": {"root": str(tmp_path), "inputs": ["cut.txt.gz"]}})
    )
    result = run_cli(["ingest", "--no-progress"], cwd=tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if not line[:2].isdigit()]
    assert len(errors) == 1 and "Aborted" not in result.stderr
    assert errors[0].startswith(
        f"error: {tmp_path / 'cut.txt.gz'}: the gzip stream is truncated or corrupt after line "
    )
    assert f"gzip -t {tmp_path / 'cut.txt.gz'}" in errors[0]
    assert not (tmp_path / "metrics").exists()


def test_corrupt_gzip_is_one_line(tmp_path):
    packed = bytearray(gzip.compress("\n".join(GOOD * 100).encode()))
    packed[20:40] = b"\x00" * 20
    (tmp_path / "bad.jsonl.gz").write_bytes(bytes(packed))
    with pytest.raises(
        InputError, match=r"bad\.jsonl\.gz: the gzip stream is truncated or corrupt"
    ):
        ingest(tmp_path, ["bad.jsonl.gz"])


def test_unterminated_csv_quote_is_quarantined_not_merged(tmp_path):
    (tmp_path / "q.csv").write_text(
        "n,text\n"
        f'1,"{GOOD[0]}\n'  # the quote never closes
        f"2,{GOOD[1]}\n"
        f"3,{GOOD[2]}\n"
        f'4,"{GOOD[3]}, with a comma"\n'
        f'5,"{GOOD[4]}\n'  # opens again at the end of the file
    )
    metrics, sentences, quarantine = ingest(tmp_path, ["q.csv"])
    assert sentences[S.TEXT].to_pylist() == [GOOD[1], GOOD[2], f"{GOOD[3]}, with a comma"]
    assert sentences[S.LINE].to_pylist() == [3, 4, 5]
    rows = quarantine.to_pylist()
    assert [(r["reason"], r["line"]) for r in rows] == [
        ("malformed_record", 2),
        ("malformed_record", 6),
    ]
    assert rows[0]["detail"].startswith("unterminated quoted field")
    assert GOOD[0] in rows[0]["text"] and GOOD[1] not in rows[0]["text"]
    assert rows[1]["detail"] == "CSV error: unexpected end of data"
    assert metrics["rows_read"] == 5 and metrics["rows_dropped"]["malformed_record"] == 2
    assert balanced(metrics)


def test_unterminated_quote_closed_by_a_later_quote_is_caught(tmp_path):
    # The quote opened on line 2 is "closed" by the quote on line 4: the csv module alone would
    # return one record holding lines 2-4.
    (tmp_path / "q.tsv").write_text(
        f'n\ttext\n1\t"{GOOD[0]}\n2\t{GOOD[1]}\n3\t{GOOD[2]}"\n4\t{GOOD[3]}\n'
    )
    metrics, sentences, quarantine = ingest(tmp_path, ["q.tsv"])
    assert sentences[S.TEXT].to_pylist() == [GOOD[1], f'{GOOD[2]}"', GOOD[3]]
    assert quarantine[S.LINE].to_pylist() == [2]
    assert "line 3 inside it reads as a record of its own" in quarantine[S.DETAIL][0].as_py()
    assert balanced(metrics) and metrics["rows_read"] == 4


def test_quoted_line_breaks_within_a_record_are_kept(tmp_path):
    (tmp_path / "ok.csv").write_bytes(
        b'n,text\n1,"The museum closes\nat six, on weekdays."\n2,"He said ""no"" twice today."\n'
        b'3,"bad"quote here\n\n'
    )
    metrics, sentences, quarantine = ingest(tmp_path, ["ok.csv"])
    assert sentences[S.TEXT].to_pylist() == [
        "The museum closes at six, on weekdays.",
        'He said "no" twice today.',
    ]
    assert sentences[S.LINE].to_pylist() == [2, 4]
    assert quarantine[S.REASON].to_pylist() == ["malformed_record", "empty"]
    assert quarantine[S.LINE].to_pylist() == [5, 6]
    assert balanced(metrics) and metrics["rows_read"] == 4


def test_a_quoted_field_spanning_too_many_lines_is_rejected(tmp_path):
    body = "".join(f"word{i} and more words here\n" for i in range(40))
    (tmp_path / "long.csv").write_text(f'text\n"{body}"\n')
    metrics, sentences, quarantine = ingest(tmp_path, ["long.csv"])
    rows = quarantine.to_pylist()
    assert rows[0]["reason"] == "malformed_record" and rows[0]["line"] == 2
    assert "within lines 2-17" in rows[0]["detail"]
    # Every physical line after the first is read once as a record of its own.
    assert metrics["rows_read"] == 41 and balanced(metrics)
    assert sentences.num_rows + quarantine.num_rows == 41


def test_bad_csv_header_is_one_line(tmp_path):
    (tmp_path / "h.csv").write_text('"text\n')
    with pytest.raises(InputError, match=r"h\.csv: cannot read the CSV header on line 1"):
        ingest(tmp_path, ["h.csv"])
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ConfigError, match="no rows read from any input"):
        ingest(tmp_path, ["e.csv"])
