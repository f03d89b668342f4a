"""The sentence-transformers export's card: Hub metadata that parses, a Hub licence identifier,
counts equal to the rows shipped, only files it ships, and the no-duplicates sampler note."""

from __future__ import annotations

import os
import re
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pairforge.pipeline.plumbing import schemas as S
from pairforge.pipeline.science.dataset_card import front_matter, hub_license, hub_metadata
from pairforge.stages.export.layouts import write_export


def _pairs() -> pa.Table:
    return pa.table(
        {
            S.TEXT: ["the cat sat on the mat .", "a dog ran in the park .", "birds fly ."],
            S.POSITIVE_TEXTS: [["a cat sat on a mat ."], ["the dog ran in a park ."], []],
            S.NEGATIVE_TEXTS: [
                ["a dog ran in the park .", "birds fly ."],
                ["the cat sat on the mat ."],
                ["the cat sat on the mat ."],
            ],
        }
    )


def _card(folder) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    head, _, body = text[4:].partition("\n---\n")
    return yaml.safe_load(head), body


@pytest.mark.parametrize(
    ("written", "hub"),
    [
        ("CC0-1.0", "cc0-1.0"),
        ("CC BY-SA 3.0 (Wikipedia text)", "cc-by-sa-3.0"),
        ("Apache 2.0", "apache-2.0"),
        ("MIT", "mit"),
        (None, "unknown"),
        ("", "unknown"),
        ("all rights reserved", "other"),
    ],
)
def test_licences_become_hub_identifiers(written, hub):
    assert hub_license(written) == hub
    meta = hub_metadata(written, 12)
    assert yaml.safe_load(front_matter(meta).strip().strip("-"))["license"] == hub


@pytest.mark.parametrize(
    ("rows", "bucket"),
    [(0, "n<1K"), (999, "n<1K"), (1_000, "1K<n<10K"), (10_824, "10K<n<100K"),
     (999_999, "100K<n<1M"), (1_000_000, "1M<n<10M")],
)  # fmt: skip
def test_hub_metadata_names_size_task_language_and_source(rows, bucket):
    meta = hub_metadata("CC BY-SA 3.0", rows, pretty_name="wiki: pairs",
                        source="princeton-nlp/datasets-for-simcse", tags=("debcse",))  # fmt: skip
    assert meta["size_categories"] == [bucket]
    assert meta["language"] == ["en"] and meta["task_categories"] == ["sentence-similarity"]
    assert meta["tags"] == ["sentence-transformers", "pairforge", "hard-negatives", "debcse"]
    assert meta["pretty_name"] == "wiki: pairs"
    assert meta["source_datasets"] == ["princeton-nlp/datasets-for-simcse"]
    # Unknown source, no name: the keys are left out, not written empty.
    assert not {"pretty_name", "source_datasets"} & set(hub_metadata(None, rows))


@pytest.mark.parametrize("fmt", ["triplet", "pair", "n-tuple"])
def test_export_card_is_hub_metadata_and_describes_what_ships(fmt, tmp_path):
    out = tmp_path / fmt
    card = {
        "name": "test corpus",
        "license": "CC0-1.0",
        "source": "data/pairs",
        "params": {"m": 2, "ipw": "calibrated", "temperature": 0.5, "seed": 0},
    }
    totals = write_export([_pairs()], out, fmt, 2, card)
    meta, body = _card(out)
    assert meta["license"] == "cc0-1.0"
    assert meta["task_categories"] == ["sentence-similarity"]
    assert "sentence-transformers" in meta["tags"] and fmt in meta["tags"]
    assert meta["size_categories"] == ["n<1K"] and meta["language"] == ["en"]
    assert meta["pretty_name"] == f"test corpus: sentence-transformers {fmt}s"
    assert "source_datasets" not in meta  # the params name no Hub source
    pattern = meta["configs"][0]["data_files"][0]["path"]
    shipped = sorted(out.glob(pattern))
    assert shipped and sum(pq.read_metadata(p).num_rows for p in shipped) == totals["rows"]
    assert f"| rows | {totals['rows']:,} |" in body
    assert totals["rows"] == {"triplet": 3, "pair": 2, "n-tuple": 1}[fmt]
    # Columns documented are the columns shipped.
    columns = pq.read_schema(shipped[0]).names
    assert re.findall(r"^\| `(\w+)` \| string \|", body, flags=re.M) == columns
    # Every file the card names is in the folder; the pairs dataset it came from is not linked.
    for named in re.findall(r"^- `([^`]+)`:", body, flags=re.M):
        assert list(out.glob(named)), named
    assert "](" not in body.split("```")[0]
    assert "BatchSamplers.NO_DUPLICATES" in body and "calibrated" in body
    # The snippet is Python that parses, loading this folder.
    snippet = re.search(r"```python\n(.*?)```", body, flags=re.S).group(1)
    compile(snippet, "README.md", "exec")
    assert f'load_dataset("{out}", split="train")' in snippet


def test_export_files_get_the_umask_modes(tmp_path):
    old = os.umask(0o027)
    try:
        write_export([_pairs()], tmp_path / "out", "triplet", 2, {"license": "CC0-1.0"})
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert files and {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o640}
