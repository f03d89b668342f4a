"""The quality benchmark's table arithmetic (benchmarks/quality_table.py), its protocol
(benchmarks/quality_rows.py) and its runner (benchmarks/quality.py) on fixture score files:
mean and sample sd over seeds, the paired difference to SimCSE seed by seed, the targets and
the markdown. No training here: the benchmark's runs take minutes each."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pairforge.stages.sample.stage import SampleConfig

SPEC = importlib.util.spec_from_file_location(
    "quality_benchmark", Path(__file__).resolve().parents[2] / "benchmarks/quality.py"
)
quality = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = quality  # registered under its name, as gpu_sitting.py loads it
SPEC.loader.exec_module(quality)
import quality_plots as plots  # noqa: E402  (beside quality.py, on the path it sets)
import quality_rows as rows  # noqa: E402
import quality_table as table  # noqa: E402


def record(row: str, seed: int, avg: float, start: str = "cls", best: int = 100) -> dict:
    """A scores.json whose 7 tasks average to ``avg`` (task t scores avg + offset_t)."""
    offsets = [-3, -2, -1, 0, 1, 2, 3]
    return {
        "row": row,
        "start": start,
        "seed": seed,
        "scores": {t: avg + o for t, o in zip(rows.TASKS, offsets, strict=True)},
        "avg": avg,
        "best_step": best,
        "steps": 500,
        "train_seconds": 60.0 * seed,
    }


@pytest.fixture
def records(tmp_path) -> list[dict]:
    rows = [
        record("simcse", 1, 75.0),
        record("simcse", 2, 76.0),
        record("simcse", 3, 77.0),
        record("ipw_calibrated", 1, 76.5),
        record("ipw_calibrated", 2, 78.0),
        record("ipw_calibrated", 3, 78.5, best=480),  # the best dev step late: flagged
        record("peer", 1, 75.5),
        record("peer", 2, 76.0),
        record("peer", 3, 76.5),
        record("uniform", 1, 76.0),
        record("uniform", 2, 77.0),
        record("debcse", 1, 77.0),
        record("debcse", 3, 77.5),  # no seed 2: paired on seeds 1 and 3 only
        record("simcse", 1, 79.0, start="mean"),
        record("peer", 1, 78.0, start="mean"),
        record("denosent", 1, 77.0, start="mask"),
        record("combined", 1, 77.2),
    ]
    # Through real files, as the benchmark reads them.
    for i, r in enumerate(rows):
        (tmp_path / f"{i}.json").write_text(json.dumps(r))
    return [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(len(rows))]


def test_mean_sd_and_paired_differences(records):
    summary = table.summarize(records)
    by = {(s["row"], s["start"]): s for s in summary}
    # ROWS order, then start.
    assert [(s["row"], s["start"]) for s in summary] == [
        ("simcse", "cls"), ("simcse", "mean"), ("peer", "cls"), ("peer", "mean"),
        ("uniform", "cls"), ("ipw_calibrated", "cls"), ("debcse", "cls"), ("denosent", "mask"),
        ("combined", "cls"),
    ]  # fmt: skip
    simcse = by["simcse", "cls"]
    assert simcse["seeds"] == [1, 2, 3]
    assert simcse["avg"] == pytest.approx((76.0, 1.0))  # sd of 75, 76, 77 with n - 1
    assert simcse["tasks"]["sts12"] == pytest.approx((73.0, 1.0))
    assert simcse["diff"]["per_seed"] == [0.0, 0.0, 0.0]

    cal = by["ipw_calibrated", "cls"]
    assert cal["avg"][0] == pytest.approx(77.666666, abs=1e-5)
    assert cal["avg"][1] == pytest.approx(math.sqrt(((76.5 - 77.6667) ** 2 + (78 - 77.6667) ** 2
                                                     + (78.5 - 77.6667) ** 2) / 2), abs=1e-3)  # fmt: skip
    # Per seed: 1.5, 2.0, 1.5 -> mean 5/3, sd of the differences (not of the rows).
    assert cal["diff"]["per_seed"] == pytest.approx([1.5, 2.0, 1.5])
    assert cal["diff"]["mean"] == pytest.approx(5 / 3)
    assert cal["diff"]["sd"] == pytest.approx(math.sqrt(1 / 12), rel=1e-9)
    # 95% interval, t with 2 degrees of freedom (4.303): 5/3 ± 4.303 * sd / sqrt(3).
    half = 4.303 * math.sqrt(1 / 12) / math.sqrt(3)
    assert cal["diff"]["ci95"] == pytest.approx((5 / 3 - half, 5 / 3 + half))
    assert cal["late_best"] == [3]

    debcse = by["debcse", "cls"]
    assert debcse["diff"]["seeds"] == [1, 3]
    assert debcse["diff"]["per_seed"] == pytest.approx([2.0, 0.5])
    # One seed: a mean without an sd; the mean start pairs with SimCSE's mean start only.
    peer_mean = by["peer", "mean"]
    assert peer_mean["avg"] == (78.0, None)
    assert peer_mean["diff"]["per_seed"] == pytest.approx([-1.0])
    assert peer_mean["diff"]["sd"] is None
    # DenoSent's prompt start pairs with the [CLS] baseline.
    assert by["denosent", "mask"]["diff"]["per_seed"] == pytest.approx([2.0])


def test_interval_is_t_over_seeds():
    assert table.interval([1.0]) is None  # one seed: no interval
    lo, hi = table.interval([1.0, 2.0, 3.0, 4.0, 5.0])  # sd 1.581, t(4) 2.776
    assert (lo, hi) == pytest.approx((3 - 2.776 * 1.5811 / math.sqrt(5), 3 + 1.963), abs=1e-3)
    many = [float(i % 7) for i in range(40)]  # beyond the table: the normal's 1.96
    mean, sd = table._mean_sd(many)
    assert table.interval(many)[1] == pytest.approx(mean + 1.96 * sd / math.sqrt(40))


def test_targets_say_met_not_met_and_not_run(records):
    # The peer's best setting is chosen by dev, not by the test sets: `peer_top` scores higher
    # on test (77.0) but lower on dev than `peer` (76.0).
    records += [record("peer_top", s, 76.8 + 0.2 * (s - 1)) for s in (1, 2, 3)]
    dev = {"peer": 81.0, "peer_top": 80.0}
    records = [{**r, "best_dev": dev.get(r["row"], 80.5)} for r in records]
    verdicts = dict(table.targets(table.summarize(records), "cls"))
    default = verdicts[
        "the default negatives (ipw_calibrated) >= the peer's best setting + 0.3, "
        "interval above 0 (cls)"
    ]
    # Per seed 76.5 - 75.5, 78 - 76, 78.5 - 76.5: 1, 2, 2; mean 1.67, sd 0.577, t(2) 4.303.
    assert default == (
        "vs peer (best peer setting by dev): met: +1.67 [+0.23, +3.10] over 3 seeds "
        "(+1.00, +2.00, +2.00)"
    )
    # Seeds 1 and 3 only: +2.0 and +0.5; with 2 seeds the interval is wide (t(1) 12.706).
    assert verdicts["DebCSE >= SimCSE + 1.0 (cls)"] == "met: +1.25 [-8.28, +10.78] over 2 seeds"
    # The best other row on the test sets is the hard side (ipw_calibrated 77.67); one seed in
    # common gives no interval, so the target is not met whatever the difference.
    assert verdicts["combined >= the best single row, interval above 0 (cls)"] == (
        "vs ipw_calibrated: NOT met: +0.70 over 1 seed (+0.70)"
    )
    mean = dict(table.targets(table.summarize(records), "mean"))
    assert mean["DebCSE >= SimCSE + 1.0 (mean)"] == "not run"
    assert mean["combined >= the best single row, interval above 0 (mean)"] == "not run"
    assert (
        mean["the default negatives (ipw_calibrated) >= the peer's best setting + 0.3, "
             "interval above 0 (mean)"] == "not run"
    )  # fmt: skip
    # Short of the margin: a positive interval is not enough.
    for r in records:
        if r["row"] == "peer" and r["start"] == "cls":
            r["avg"] = {1: 76.3, 2: 77.8, 3: 78.2}[r["seed"]]
    verdicts = dict(table.targets(table.summarize(records), "cls"))
    assert [v for k, v in verdicts.items() if k.startswith("the default")][0].startswith(
        "vs peer (best peer setting by dev): NOT met: +0.23 ["
    )


def test_negatives_rows_are_ranked_by_dev_not_by_test(records):
    dev = {"peer": 81.5, "ipw_calibrated": 80.2, "uniform": 80.9, "simcse": 90.0}
    records = [{**r, "best_dev": dev.get(r["row"], 70.0)} for r in records]
    lines = table.dev_table(table.summarize(records), "cls")
    # SimCSE and the mined-positives rows are not negatives rows; one line per negatives row,
    # under a header naming the peer's best setting by dev, which the test column pairs with.
    assert lines[0].startswith("| row | negatives | seeds | dev | dev - default, paired [95%] |")
    assert "| test - peer, paired [95%] |" in lines[0]
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| `peer`",
        "| `uniform`",
        "| `ipw_calibrated`",
    ]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    # peer: every seed +1.3 on dev over the default (an interval of width 0 above 0).
    assert cells[0][2:] == [
        "1, 2, 3", "81.50 ± 0.00", "+1.30 [+1.30, +1.30]", "replaces the default",
        "76.00 ± 0.50", "", "-",
    ]  # fmt: skip
    # uniform: test 76.0 and 77.0 against the peer's 75.5 and 76.0 (seeds 1, 2): +0.5, +1.0.
    assert cells[1][3:] == [
        "80.90 ± 0.00", "+0.70 [+0.70, +0.70]", "replaces the default", "76.50 ± 0.71",
        "+0.75 [-2.43, +3.93]", "-",
    ]  # fmt: skip
    # The default has no dev difference to itself; its seed 3 kept step 480 of 500.
    assert cells[2][1] == "negatives by IPW, calibrated (**the default**)"
    assert cells[2][4:] == ["", "", "77.67 ± 1.04", "+1.67 [+0.23, +3.10]", "3 (480/500)"]
    assert table.dev_table(table.summarize([{**r, "best_dev": None} for r in records])) == []


def test_a_row_first_by_dev_replaces_the_default_only_when_separated(records):
    """The rule of docs/quality.md: the paired dev difference to the default, over the seeds
    both have, must have its 95% interval above 0; first by mean dev is not enough."""
    dev = {
        ("ipw_calibrated", 1): 80.0, ("ipw_calibrated", 2): 80.5, ("ipw_calibrated", 3): 80.2,
        # +0.9, -0.1, +0.5 over the default: first by dev, the interval reaches below 0
        ("peer", 1): 80.9, ("peer", 2): 80.4, ("peer", 3): 80.7,
        # +0.2 on seeds 1 and 2 alone (no seed 3): an interval of width 0 above 0
        ("uniform", 1): 80.2, ("uniform", 2): 80.7,
    }  # fmt: skip
    records = [{**r, "best_dev": dev.get((r["row"], r["seed"]))} for r in records]
    summary = table.summarize(records)
    by_row = {s["row"]: s for s in summary if s["start"] == "cls"}
    d = table.dev_versus_default(by_row["peer"], by_row["ipw_calibrated"])
    assert d["n"] == 3 and d["per_seed"] == pytest.approx([0.9, -0.1, 0.5])
    assert d["mean"] == pytest.approx(0.4333, abs=1e-3)
    assert d["ci95"][0] < 0 < d["ci95"][1] and not d["replaces"]
    u = table.dev_versus_default(by_row["uniform"], by_row["ipw_calibrated"])
    assert u["n"] == 2 and u["replaces"]  # both seeds +0.2: the rule moves the default
    lines = table.dev_table(summary, "cls")
    assert lines[2].startswith("| `peer` | negatives of ST mine_hard_negatives (random) | 1, 2, 3 |"
                               " 80.67 ± 0.25 | +0.43 [")  # fmt: skip
    assert " | not separated | " in lines[2]
    assert lines[3].startswith("| `uniform` |") and " | replaces the default | " in lines[3]
    assert lines[4].startswith("| `ipw_calibrated` |") and " | 80.23 ± 0.25 |  |  | " in lines[4]
    # One seed in common gives no interval: never a replacement.
    one = [r for r in records if not (r["row"] == "uniform" and r["seed"] == 2)]
    by_row = {s["row"]: s for s in table.summarize(one) if s["start"] == "cls"}
    assert not table.dev_versus_default(by_row["uniform"], by_row["ipw_calibrated"])["replaces"]


def test_markdown_lists_every_row_with_its_spread(records):
    untrained = {"cls": {t: 70.0 for t in (*rows.TASKS, "avg")}}
    settings = {"steps": 500, "batch": 64, "lr": 3e-5, "eval_every": 25, "dev_pairs": None,
                "test_pairs": None}  # fmt: skip
    text = table.markdown(table.summarize(records), untrained, settings)
    lines = text.splitlines()
    assert lines[0].startswith("| row | start | seeds | STS12 |")
    assert "| MiniLM, untrained | cls |" in lines[2]
    cal = next(line for line in lines if line.startswith("| + negatives by IPW, calibrated"))
    assert "**77.67 ± 1.04**" in cal and "| +1.67 ± 0.29 [+0.95, +2.38] |" in cal
    assert "500 steps x 64 rows" in text and "(all pairs each)" in text
    assert "ipw_calibrated/cls seeds [3]" in text


def test_every_row_names_a_sampler_and_every_sampler_a_pools_variant():
    """The variants are declared once: each row's pairs are a sampler's (or a peer's), each
    sampler mines from a declared pools variant, and each calibrated row is judged against the
    uniform draw from its own pools."""
    for name, row in rows.ROWS.items():
        assert row.pairs in (*rows.SAMPLERS, *rows.PEERS), name
    for name, spec in rows.SAMPLERS.items():
        assert spec.pools in rows.POOLS, name
        assert "--output" not in spec.options and "--pools" not in spec.options, name
    assert rows.POOLS["band"] == {}  # the profile's own pools, mined by the pipeline
    for cal, uniform in {"ipw_calibrated": "uniform", "knn_calibrated": "knn_uniform",
                         "band40_calibrated": "band40_uniform"}.items():  # fmt: skip
        # same pools, only the draw differs
        assert rows.SAMPLERS[rows.ROWS[cal].pairs].pools == (
            rows.SAMPLERS[rows.ROWS[uniform].pairs].pools
        ), cal
    assert rows.DEFAULT_ROW in rows.NEGATIVE_ROWS
    # The knn pools are the peer's terms: its depth, no random fill of short pools.
    assert rows.POOLS["knn"] == {"pool_cap": None, "fallback": "none"}


def test_markdown_shows_the_dev_score_rows_are_chosen_by(records):
    records = [{**r, "best_dev": 80.0 + r["seed"]} for r in records]
    settings = {"steps": 500, "batch": 64, "lr": 3e-5, "eval_every": 25, "dev_pairs": None,
                "test_pairs": None}  # fmt: skip
    text = table.markdown(table.summarize(records), {}, settings)
    head = text.splitlines()[0].split(" | ")
    simcse = next(
        line for line in text.splitlines() if line.startswith("| SimCSE") and "| cls |" in line
    )
    cells = simcse.split(" | ")
    assert head[head.index("dev")] == "dev"
    assert cells[head.index("dev")] == "82.00"  # seeds 1-3: 81, 82, 83


def test_hardness_plot_places_each_negatives_row_at_its_samplers_cosine(records, tmp_path):
    stats = {"calibrated": {"cos_mean": 0.27}, "peer": {"cos_mean": 0.38}}  # no uniform stats
    points = plots.plot_hardness(table.summarize(records), stats, tmp_path / "h.png")
    # uniform has scores but no sampler statistics; debcse is not a negatives-only row.
    assert [(p[0], p[1]) for p in points] == [("peer", 0.38), ("ipw_calibrated", 0.27)]
    assert points[1][2] == pytest.approx(77.666666, abs=1e-4)
    assert (tmp_path / "h.png").stat().st_size > 10_000


def test_records_kept_in_the_repository_resume_the_table_and_the_runs(tmp_path, capsys):
    """A run recorded under ``--records`` (another machine's) is not run again and enters the
    table; where a run folder and a record both hold a (row, start, seed), the folder's wins; a
    run folder's scores not yet recorded are recorded when the driver passes them."""
    runs, records = tmp_path / "runs", tmp_path / "records"
    quality.write_json(quality.record_path(records, "simcse", "cls", 1), record("simcse", 1, 75.0))
    quality.write_json(quality.record_path(records, "peer", "cls", 1), record("peer", 1, 70.0))
    quality.write_json(runs / "peer/cls/seed1/scores.json", record("peer", 1, 76.0))
    quality.write_json(runs / "uniform/cls/seed2/scores.json", record("uniform", 2, 77.0))
    got = {(r["row"], r["seed"]): r["avg"] for r in quality.load_records(runs, records)}
    assert got == {("simcse", 1): 75.0, ("peer", 1): 76.0, ("uniform", 2): 77.0}
    # Neither is trained again (no pipeline, no pairs: a run would fail here).
    quality.run_one(runs, records, "simcse", "cls", 1, {}, {}, None)
    quality.run_one(runs, records, "uniform", "cls", 2, {}, {}, None)
    assert capsys.readouterr().out.count("done before, kept") == 2
    kept = quality.record_path(records, "uniform", "cls", 2)
    assert json.loads(kept.read_text())["avg"] == 77.0
    # DenoSent's start is its prompt, whatever start the row is asked for.
    quality.write_json(
        quality.record_path(records, "denosent", "mask", 1), record("denosent", 1, 1)
    )
    quality.run_one(runs, records, "denosent", "cls", 1, {}, {}, None)
    assert capsys.readouterr().out.count("done before, kept") == 1


def test_a_smoke_corpus_or_another_peer_seed_records_apart_from_the_full_run(tmp_path):
    """Records are keyed by the settings tag: a ``--lines`` smoke run or another peer seed must
    not be taken for the full run's (which keeps the tag it always had); an untrained score of
    a run folder from before the records is recorded instead of evaluated again."""
    full = SimpleNamespace(steps=100, batch=32, lr=3e-5, eval_every=25, dev_pairs=500,
                           test_pairs=None, lines=None, peer_seed=0)  # fmt: skip
    assert quality.settings_tag(full) == "s100-b32-lr3e-05-e25-dev500-testall"
    smoke = SimpleNamespace(**{**vars(full), "lines": 400})
    peer = SimpleNamespace(**{**vars(full), "peer_seed": 1})
    tags = {quality.settings_tag(a) for a in (full, smoke, peer)}
    assert len(tags) == 3
    runs, records = tmp_path / "runs", tmp_path / "records"
    base = {"cls": {"avg": 73.69}}
    quality.write_json(runs / "untrained/scores.json", base)
    assert quality.untrained(runs, records, {}, full) == base  # no evaluate: {} has no section
    assert json.loads((records / "untrained.json").read_text()) == base


def test_gpu_precision_and_another_start_record_apart_and_enter_the_records(tmp_path):
    """A bf16 run (GPU autocast) or another start encoder (a smoke model) gets a settings folder
    of its own, and its records say so; the default fp32 MiniLM runs keep the tag and settings
    they always had (the CPU sittings' records stay valid)."""
    full = SimpleNamespace(steps=500, batch=64, lr=3e-5, eval_every=25, dev_pairs=None,
                           test_pairs=None, lines=None, peer_seed=0, precision="fp32",
                           start=quality.START)  # fmt: skip
    assert quality.settings_tag(full) == "s500-b64-lr3e-05-e25-devall-testall"
    assert "precision" not in quality.settings_of(full) and "start" not in quality.settings_of(full)
    gpu = SimpleNamespace(**{**vars(full), "precision": "bf16"})
    tiny = SimpleNamespace(**{**vars(gpu), "start": "/tmp/tiny-minilm"})
    assert quality.settings_tag(gpu) == "s500-b64-lr3e-05-e25-devall-testall-bf16"
    assert quality.settings_tag(tiny).startswith("s500-b64-lr3e-05-e25-devall-testall-bf16-start")
    assert len({quality.settings_tag(a) for a in (full, gpu, tiny)}) == 3
    assert quality.settings_of(tiny)["precision"] == "bf16"
    assert quality.settings_of(tiny)["start"] == "/tmp/tiny-minilm"


def test_apertium_positives_mine_and_record_apart_from_the_stand_ins(tmp_path, shared_data):
    """The default positives are Apertium's (the apertium profile's routes and sample routes),
    in a pipeline folder and a settings folder of their own; the stand-in sittings keep theirs."""
    full = SimpleNamespace(steps=500, batch=64, lr=3e-5, eval_every=25, dev_pairs=None,
                           test_pairs=None, lines=3, peer_seed=0, positives="apertium")  # fmt: skip
    standin = SimpleNamespace(**{**vars(full), "positives": "standin"})
    assert quality.settings_tag(full) == quality.settings_tag(standin) + "-apertium"
    assert quality.settings_of(full)["positives"] == "apertium"
    assert "positives" not in quality.settings_of(standin)
    assert quality.pipeline_folder(full, tmp_path) == tmp_path / "pipeline-apertium"
    assert quality.pipeline_folder(standin, tmp_path) == tmp_path / "pipeline"
    params = quality.pipeline_params(full, tmp_path)
    assert params["backtranslate"]["engine"] == "apertium"
    assert [r["name"] for r in params["backtranslate"]["routes"]] == [
        "en-es-en", "en-ca-en", "en-eo-en"
    ]  # fmt: skip
    assert params["sample"]["positive_route"] == "en-es-en"
    assert params["ingest"]["root"] == "corpus"  # the 3-line smoke corpus under tmp_path
    assert params["embed"]["max_length"] == 256  # the peer's max_seq_length
    # The records' draws (one generator per shard and anchor batch), not the stage's default.
    assert params["sample"]["draws"] == "stream" != SampleConfig.model_fields["draws"].default
    old = quality.pipeline_params(standin, tmp_path)
    assert old["backtranslate"]["engine"] == "ctranslate2" and old["embed"]["max_length"] == 128
    assert {"peer_top", "knn_posaware", "knn_simans"} <= set(rows.ROWS)
    assert rows.PEERS["peer_top"] == ("top", 0.05)


def _plan_args(**kw):
    base = dict(rows=["simcse", "peer", "denosent", "combined", "band40_uniform"], seeds=[1, 2],
                starts=["cls", "mean"], mean_rows=["simcse", "peer"], jobs=1)  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_the_plan_is_seed_major_and_puts_the_slow_objectives_first_with_several_jobs():
    """Runs go seed by seed (a table cut short holds whole seeds); DenoSent has one start (its
    prompt), the mean start only trains --mean-rows; with --jobs > 1 the decoder objectives
    start first within a seed so they do not end it alone, the rest in the sequential order."""
    sequential = quality.plan(_plan_args())
    one_seed = [
        ("simcse", "cls", 1), ("peer", "cls", 1), ("denosent", "cls", 1), ("combined", "cls", 1),
        ("band40_uniform", "cls", 1), ("simcse", "mean", 1), ("peer", "mean", 1),
    ]  # fmt: skip
    assert sequential == one_seed + [(r, s, 2) for r, s, _ in one_seed]
    parallel = quality.plan(_plan_args(jobs=4))
    assert [r[2] for r in parallel] == [1] * 7 + [2] * 7
    assert parallel[:2] == [("denosent", "cls", 1), ("combined", "cls", 1)]
    assert parallel[2:7] == [r for r in one_seed if r[0] not in ("denosent", "combined")]
    assert sorted(parallel) == sorted(sequential)


def test_train_params_carry_the_run_settings(tmp_path):
    """Precision, threads, the checkpoint interval and the start encoder reach the train and
    evaluate sections; the checkpoint interval defaults to the dev interval."""
    pipeline = {
        "train": {"recipes": {"simcse": {"options": {"temperature": 0.05}}}, "model": "x"},
        "evaluate": {"models": []},
    }
    args = SimpleNamespace(batch=64, lr=3e-5, steps=500, eval_every=25, save_every=None,
                           dev_pairs=None, test_pairs=None, precision="bf16", threads=2,
                           start="/m")  # fmt: skip
    p = quality.train_params(pipeline, rows.ROWS["peer"], "cls", 3, tmp_path / "pairs", args)
    t = p["train"]
    assert (t["precision"], t["threads"], t["save_every"], t["model"]) == ("bf16", 2, 25, "/m")
    assert t["objective"] == "simcse_hn" and t["seed"] == 3
    assert t["recipes"]["simcse_hn"]["options"]["pooling"] == "cls_before_pooler"
    assert p["evaluate"]["threads"] == 2
    args.save_every = 500
    p = quality.train_params(pipeline, rows.ROWS["peer"], "mean", 3, tmp_path / "pairs", args)
    assert p["train"]["save_every"] == 500
    assert p["train"]["recipes"]["simcse_hn"]["options"]["pooling"] == "mean"


def test_a_finished_mining_needs_only_the_pairs_of_the_rows_asked_for(tmp_path, monkeypatch):
    """A run folder carried elsewhere (a GPU machine) with the pairs of its rows only is not
    mined again; a row whose pairs are missing sends the driver back to mining."""
    out = tmp_path / "quality"
    (out / "pipeline").mkdir(parents=True)
    (out / "pipeline/params.yaml").write_text("mine: {}\nsample: {}\n")
    quality.write_json(out / "mining.json", {"complete": True})
    for name in ("calibrated", "peer"):
        quality.write_json(out / f"pipeline/data/pairs-{name}/_manifest.json", {})
    called = []
    monkeypatch.setattr(quality, "pairforge", lambda args, cwd, log: called.append(args) or 0.0)
    monkeypatch.setattr(quality, "pairs_digest", lambda path: path.name)  # no shards here
    args = SimpleNamespace(rows=["simcse", "peer", "debcse"], remine=False, lines=None)
    pairs = quality.mine(args, out)
    assert called == [] and pairs["peer"] == out / "pipeline/data/pairs-peer"
    args.rows = ["simcse", "uniform"]
    quality.mine(args, out)
    samples = [c[c.index("--output") + 1] for c in called if c[0] == "sample"]
    assert "data/pairs-uniform" in samples
    assert "data/pairs-calibrated" not in samples  # finished before: not sampled again
    digests = json.loads((out / "mining.json").read_text())["pairs_digests"]
    assert digests == {"calibrated": "pairs-calibrated", "peer": "pairs-peer"}


def _write_pairs(path: Path, ids: list[str], negatives: list[list[str]], cos: float, shard: int):
    """A real pairs dataset (the pipeline's schema, verified reads): every column filled, the
    anchors' ids and negative ids as given, every float ``cos``, ``shard`` rows a shard."""
    import pyarrow as pa
    from pairforge.pipeline.plumbing import schemas as S
    from pairforge.pipeline.plumbing.shards import DatasetWriter

    def column(field, anchors):
        if field.name == "id":
            return anchors
        if field.name == "negative_ids":
            return [negatives[ids.index(i)] for i in anchors]
        t = field.type
        if pa.types.is_list(t):
            one = column(pa.field(field.name, t.value_type), anchors)
            return [[v, v] for v in one]
        if pa.types.is_string(t):
            return [f"{field.name}:{i}" for i in anchors]
        if pa.types.is_floating(t):
            return [cos] * len(anchors)
        if pa.types.is_boolean(t):
            return [False] * len(anchors)
        return [2] * len(anchors)

    writer = DatasetWriter(path, S.PAIRS, stage="test", params={}, fingerprint=f"t{cos}")
    chunks = [ids[k : k + shard] for k in range(0, len(ids), shard)]
    for index, anchors in enumerate(chunks):
        cols = {f.name: pa.array(column(f, anchors), f.type) for f in S.PAIRS.schema}
        writer.write(index, pa.table(cols, schema=S.PAIRS.schema))
    writer.finalize(len(chunks))


def test_the_pairs_digest_tells_two_minings_draws_apart_and_not_their_scores(tmp_path):
    """Two minings that drew the same anchors, positives and negatives have one digest, whatever
    their scores' last bits, row order or sharding; one negative drawn otherwise changes it."""
    ids = ["a", "b", "c"]
    negatives = [["x", "y"], ["y", "z"], ["z", "x"]]
    _write_pairs(tmp_path / "one", ids, negatives, cos=0.5, shard=3)
    _write_pairs(tmp_path / "two", ids[::-1], negatives[::-1], cos=0.5000001, shard=2)
    other = [["x", "y"], ["y", "w"], ["z", "x"]]
    _write_pairs(tmp_path / "three", ids, other, cos=0.5, shard=3)
    one = quality.pairs_digest(tmp_path / "one")
    assert len(one) == 64
    assert quality.pairs_digest(tmp_path / "two") == one
    assert quality.pairs_digest(tmp_path / "three") != one


def test_dev_curves_are_averaged_over_seeds_and_plotted(tmp_path):
    """The curve plot averages each (row, start)'s dev scores step by step over its seeds,
    puts DenoSent's prompt start beside [CLS], and leaves out records without curves."""
    recs = [
        {**record("simcse", 1, 75.0), "dev_curve": [[25, 70.0], [50, 72.0]]},
        {**record("simcse", 2, 75.0), "dev_curve": [[25, 74.0], [50, 76.0]]},
        {**record("denosent", 1, 76.0, start="mask"), "dev_curve": [[25, 60.0]]},
        record("peer", 1, 76.0),  # an older sitting's record: no curve
    ]
    path = tmp_path / "curves.png"
    curves = plots.plot_curves(recs, path)
    assert curves == {("simcse", "cls"): [(25, 72.0), (50, 74.0)],
                      ("denosent", "mask"): [(25, 60.0)]}  # fmt: skip
    assert path.stat().st_size > 10_000
    assert plots.plot_curves([record("peer", 1, 76.0)], tmp_path / "none.png") == {}
    assert not (tmp_path / "none.png").exists()


def test_differences_plot_draws_each_rows_paired_difference_with_its_interval(records, tmp_path):
    """The table's result as a figure: every row but the baseline with a paired seed, its
    mean difference, its t interval (none for one seed) and each seed's difference; DenoSent's
    prompt start is drawn beside [CLS]. A table with nothing paired draws nothing."""
    path = tmp_path / "differences.png"
    entries = plots.plot_differences(table.summarize(records), path)
    assert [(row, start) for row, start, *_ in entries] == [
        ("peer", "cls"), ("peer", "mean"), ("uniform", "cls"), ("ipw_calibrated", "cls"),
        ("debcse", "cls"), ("denosent", "mask"), ("combined", "cls"),
    ]  # fmt: skip
    by = {(row, start): (mean, ci, seeds) for row, start, mean, ci, seeds in entries}
    mean, ci, seeds = by["ipw_calibrated", "cls"]
    half = 4.303 * math.sqrt(1 / 12) / math.sqrt(3)
    assert (mean, seeds) == (pytest.approx(5 / 3), pytest.approx([1.5, 2.0, 1.5]))
    assert ci == pytest.approx((5 / 3 - half, 5 / 3 + half))
    assert by["peer", "mean"] == (pytest.approx(-1.0), None, pytest.approx([-1.0]))
    assert by["denosent", "mask"][2] == pytest.approx([2.0])  # against SimCSE's [CLS] seed 1
    assert path.stat().st_size > 10_000
    only_baseline = [r for r in records if r["row"] == "simcse"]
    assert plots.plot_differences(table.summarize(only_baseline), tmp_path / "none.png") == []
    assert not (tmp_path / "none.png").exists()


def test_a_run_record_keeps_its_curves(tmp_path):
    history = tmp_path / "history.json"
    history.write_text(json.dumps({
        "history": [{"step": 10, "loss": 1.23456789, "lr": 1e-5}],
        "dev_history": [{"step": 25, "score": 80.123456, "stsb_dev": 1.0}],
    }))  # fmt: skip
    assert quality._curves(history) == {"dev_curve": [[25, 80.123]], "loss_curve": [[10, 1.2346]]}
    assert quality._curves(tmp_path / "missing.json") == {}


def test_a_companion_rerun_is_told_apart_from_an_unsettled_one():
    """SimCSE's run of a seed rerun only to pair at equal length with another row's unsettled
    rerun (its own run had settled) is not said to have been unsettled."""

    def run(row, seed, best, steps=500):
        return {**record(row, seed, 76.0, best=best), "steps": steps, "settings": {"steps": 500}}

    summary = table.summarize([
        run("simcse", 1, 475), run("simcse", 1, 650, steps=1000),  # late at 500: rerun
        run("simcse", 2, 275), run("simcse", 2, 300, steps=1000),  # settled: the companion
        run("peer", 2, 450), run("peer", 2, 700, steps=1000),  # late at 500: rerun
    ])  # fmt: skip
    by = {s["row"]: s for s in summary}
    assert (by["simcse"]["settled"], by["simcse"]["companion"]) == ({1: 1000}, {2: 1000})
    assert (by["peer"]["settled"], by["peer"]["companion"]) == ({2: 1000}, {})
    text = table.markdown(summary, {}, {"steps": 500, "batch": 64, "lr": 3e-5, "eval_every": 25,
                                        "dev_pairs": None, "test_pairs": None})  # fmt: skip
    late, _, beside = text.partition("Run with more steps beside another row's run")
    assert "simcse/cls seeds {1: 1000}; peer/cls seeds {2: 1000}" in late
    assert "simcse/cls seeds {2: 1000}" in beside and "peer/cls" not in beside


def test_unsettled_runs_are_rerun_with_more_steps_and_paired_at_equal_length(tmp_path, capsys):
    """A recorded run whose best dev step is in the last 20% is queued again with
    ``--settle-steps``, with SimCSE's run of the same seed at that length (once each: not when
    recorded). The table takes a row's settled run and pairs it with SimCSE's run of the same
    length only; a seed without one is left out of the difference and listed."""
    runs, records = tmp_path / "runs", tmp_path / "records"

    def keep(row, seed, avg, best=100, steps=None):
        r = dict(record(row, seed, avg, best=best), settings={"steps": 500})
        r["steps"] = steps or 500
        quality.write_json(quality.record_path(records, row, "cls", seed, steps), r)

    keep("simcse", 1, 75.0, best=475)  # late: rerun
    keep("simcse", 2, 76.0)
    keep("peer", 1, 75.5, best=500)  # late: rerun (SimCSE seed 1 is queued already)
    keep("peer", 2, 76.5, best=401)  # late: rerun, and SimCSE seed 2 at 1000 beside it
    args = _plan_args(rows=["simcse", "peer"], starts=["cls"], settle_steps=1000)
    assert quality.unsettled(records, args) == [
        ("simcse", "cls", 1), ("peer", "cls", 1), ("peer", "cls", 2), ("simcse", "cls", 2),
    ]  # fmt: skip
    assert quality.unsettled(records, _plan_args(rows=["simcse"], settle_steps=None)) == []
    # SimCSE's seed 1 and the peer's seed 1 rerun and recorded: neither is queued again.
    keep("simcse", 1, 75.8, best=650, steps=1000)
    keep("peer", 1, 76.1, best=700, steps=1000)
    assert quality.record_path(records, "peer", "cls", 1, 1000).name == "seed1-s1000.json"
    assert quality.unsettled(records, args) == [("peer", "cls", 2), ("simcse", "cls", 2)]
    # DebCSE's seed 2 rerun, but not SimCSE's seed 2: that seed is unpaired.
    keep("debcse", 2, 77.0, steps=1000)
    keep("debcse", 1, 77.5)
    loaded = quality.load_records(runs, records)
    assert [(r["row"], r["seed"], r["steps"]) for r in loaded if r["row"] == "simcse"] == [
        ("simcse", 1, 500), ("simcse", 1, 1000), ("simcse", 2, 500),
    ]  # fmt: skip
    summary = {s["row"]: s for s in table.summarize(loaded)}
    assert summary["simcse"]["avg"][0] == pytest.approx((75.8 + 76.0) / 2)  # the settled runs
    assert summary["simcse"]["settled"] == {1: 1000} and summary["simcse"]["late_best"] == []
    peer = summary["peer"]
    assert peer["settled"] == {1: 1000} and peer["late_best"] == [2]
    # Seed 1 at 1000 against SimCSE's at 1000; seed 2 at 500 against SimCSE's at 500.
    assert peer["diff"]["per_seed"] == pytest.approx([76.1 - 75.8, 76.5 - 76.0])
    assert summary["debcse"]["diff"]["seeds"] == [1] and summary["debcse"]["diff"]["unpaired"] == [
        2
    ]
    text = table.markdown(list(summary.values()), {}, {"steps": 500, "batch": 64, "lr": 3e-5,
                            "eval_every": 25, "dev_pairs": None, "test_pairs": None})  # fmt: skip
    assert "Rerun with more steps" in text and "peer/cls seeds {1: 1000}" in text
    assert "debcse/cls seeds [2]" in text  # unpaired: said under the table
    # The settled reading pairs each seed's settled runs, whatever their lengths where neither
    # row has a run of the other's: DebCSE's seed 1 (500 steps) against SimCSE's seed 1 at
    # 1000, its seed 2 (1000) against SimCSE's 500.
    settled = summary["debcse"]["diff_settled"]
    assert settled["seeds"] == [1, 2] and settled["mixed"] == [1, 2]
    assert settled["per_seed"] == pytest.approx([77.5 - 75.8, 77.0 - 76.0])
    assert summary["peer"]["diff_settled"]["mixed"] == []  # equal lengths on both seeds
    assert summary["peer"]["diff_settled"]["per_seed"] == peer["diff"]["per_seed"]
    head = text.splitlines()[0].split(" | ")
    debcse = next(line for line in text.splitlines() if line.startswith("| DebCSE")).split(" | ")
    assert debcse[head.index("Δ vs SimCSE (paired)")] == "+2.50"  # seed 1 only, at 500 steps
    assert debcse[head.index("Δ, settled runs")] == "+1.35 ± 0.49 [-3.10, +5.80]"
    assert "seeds of unequal lengths: debcse/cls [1, 2]" in text
    # Two rows paired with each other, not through the baseline: at equal lengths only the
    # seeds where both have a run of the same length (the longest such), in the settled reading
    # every seed both have.
    keep("combined", 1, 78.0)
    keep("combined", 2, 77.8)
    both = {s["row"]: s for s in table.summarize(quality.load_records(runs, records))}
    equal = table.paired(both["combined"], both["debcse"])
    assert (equal["n"], equal["per_seed"]) == (1, pytest.approx([0.5]))  # seed 2: 500 vs 1000
    settled = table.paired(both["combined"], both["debcse"], "settled")
    assert settled["per_seed"] == pytest.approx([0.5, 0.8])
    assert table.paired(both["debcse"], both["simcse"])["per_seed"] == pytest.approx([2.5])
    target = "DebCSE >= SimCSE + 1.0 (cls)"
    assert dict(table.targets(list(summary.values())))[target] == "met: +2.50 over 1 seed"
    assert dict(table.targets(list(summary.values()), "cls", "settled"))[target] == (
        "met: +1.35 [-3.10, +5.80] over 2 seeds"
    )
    # A rerun is its own folder and record: a recorded one is skipped like any run.
    quality.run_one(runs, records, "simcse", "cls", 1, {}, {}, None, steps=1000)
    assert "simcse / cls / seed 1 (1000 steps): done before, kept" in capsys.readouterr().out


def test_a_companion_pairs_only_with_a_row_read_at_its_length():
    """A settled run's companion (``--also-steps``) is paired with a row whose settle rerun has
    its length, and never stands in for the settled run: not in the row's figures, not against
    a row read at the protocol's length (the default's 1,000-step companion against the peer's
    settled 500-step run would give it a longer schedule than its rival), on test and dev."""

    def run(row, seed, avg, best, steps=500, dev=None):
        r = {**record(row, seed, avg, best=best), "steps": steps, "settings": {"steps": 500}}
        return {**r, "best_dev": 80.0 if dev is None else dev}

    summary = table.summarize([
        run("simcse", 1, 76.0, 100), run("simcse", 2, 76.0, 100),
        run("ipw_calibrated", 1, 77.0, 200, dev=80.5),  # settled at 500
        run("ipw_calibrated", 1, 78.0, 500, steps=1000, dev=81.0),  # its companion
        run("ipw_calibrated", 2, 77.2, 200, dev=80.4),  # no companion on seed 2
        run("peer", 1, 76.8, 100, dev=80.2), run("peer", 2, 76.9, 100, dev=80.1),
        run("uniform", 1, 77.1, 475, dev=80.6),  # late at 500: its settle rerun below
        run("uniform", 1, 77.9, 600, steps=1000, dev=81.3),
        run("uniform", 2, 77.0, 100, dev=80.3),
    ])  # fmt: skip
    by = {s["row"]: s for s in summary}
    default = by["ipw_calibrated"]
    assert default["reads"] == {1: 500, 2: 500} and default["companion"] == {1: 1000}
    assert default["settled"] == {} and by["uniform"]["settled"] == {1: 1000}
    assert default["avg"][0] == pytest.approx(77.1)  # the settled runs: 77.0 and 77.2
    assert default["best_dev"][0] == pytest.approx(80.45)
    # Against the peer (read at 500 on both seeds): the settled runs, not the companion.
    assert table.paired(default, by["peer"], "settled")["per_seed"] == pytest.approx([0.2, 0.3])
    # Against `uniform`, read at 1000 on seed 1: the companion, at equal length; seed 2 at 500.
    versus = table.paired(by["uniform"], default, "settled")
    assert versus["per_seed"] == pytest.approx([77.9 - 78.0, 77.0 - 77.2])
    dev = table.dev_versus_default(by["uniform"], default)
    assert dev["per_seed"] == pytest.approx([81.3 - 81.0, 80.3 - 80.4])
    assert table.dev_versus_default(by["peer"], default)["per_seed"] == pytest.approx([-0.3, -0.3])
    # Against SimCSE (500 on both seeds): the settled runs, equal lengths, none mixed.
    assert default["diff_settled"]["per_seed"] == pytest.approx([1.0, 1.2])
    assert default["diff_settled"]["mixed"] == []
    assert not table.mixed_lengths([by["simcse"], default, by["peer"]])


def test_a_companion_meets_a_baseline_rerun_at_its_length_and_a_late_one_is_said():
    """The default's companion meets SimCSE's settle rerun of its length in the settled reading
    (Δ keeps the default's settled run, against SimCSE's run of that length), the table then
    shows both readings even with no seed paired at unequal lengths, and a companion that did
    not settle itself is said under the table. A seed rerun to settle and run longer still is
    read at its rerun, the longest run its companion."""

    def run(row, seed, avg, best, steps=500):
        r = {**record(row, seed, avg, best=best), "steps": steps, "settings": {"steps": 500}}
        return {**r, "best_dev": 80.0}

    summary = table.summarize([
        run("simcse", 1, 76.0, 475), run("simcse", 1, 76.5, 600, steps=1000),  # late, rerun
        run("ipw_calibrated", 1, 77.0, 200),  # settled at 500
        run("ipw_calibrated", 1, 77.8, 950, steps=1000),  # its companion, late itself
        run("uniform", 1, 77.1, 490), run("uniform", 1, 77.4, 500, steps=1000),  # rerun
        run("uniform", 1, 77.6, 900, steps=2000),  # beside a rerun of 2,000 elsewhere
    ])  # fmt: skip
    by = {s["row"]: s for s in summary}
    default, uniform = by["ipw_calibrated"], by["uniform"]
    assert default["diff"]["per_seed"] == pytest.approx([1.0])  # 500 against SimCSE's 500
    assert default["diff_settled"]["per_seed"] == pytest.approx([77.8 - 76.5])  # at 1,000
    assert default["diff_settled"]["mixed"] == [] and table.mixed_lengths([by["simcse"], default])
    assert default["late_companion"] == [1] and default["late_best"] == []
    assert (uniform["reads"], uniform["settled"], uniform["companion"]) == (
        {1: 1000}, {1: 1000}, {1: 2000},
    )  # fmt: skip
    assert uniform["avg"][0] == pytest.approx(77.4) and uniform["late_companion"] == []
    assert uniform["diff_settled"]["per_seed"] == pytest.approx([77.4 - 76.5])
    text = table.markdown(summary, {}, {"steps": 500, "batch": 64, "lr": 3e-5, "eval_every": 25,
                                        "dev_pairs": None, "test_pairs": None})  # fmt: skip
    head = text.splitlines()[0].split(" | ")
    line = next(x for x in text.splitlines() if x.startswith("| + negatives by IPW, calibrated |"))
    assert line.split(" | ")[head.index("Δ, settled runs")] == "+1.30"
    assert "uniform/cls seeds {1: 2000}; ipw_calibrated/cls seeds {1: 1000}" in text
    assert "Companions whose best dev step is in the last 20%" in text
    assert "not have settled): ipw_calibrated/cls seeds [1]" in text


def test_also_steps_runs_settled_runs_at_the_reruns_length_after_the_asked_ones(tmp_path):
    """``--also-steps`` queues the asked rows and seeds again at that length, settled or not,
    after the settle reruns and the protocol's runs, without queuing a rerun twice; the table
    tells such a run apart, a companion (its own run had settled)."""
    records = tmp_path / "records"

    def keep(row, seed, best, steps=None):
        r = dict(record(row, seed, 76.0 + seed / 10, best=best), settings={"steps": 500})
        r["steps"] = steps or 500
        quality.write_json(quality.record_path(records, row, "cls", seed, steps), r)

    keep("simcse", 1, 100)
    keep("simcse", 2, 475)  # late: the rule's rerun, at the same length as --also-steps
    args = _plan_args(rows=["simcse"], starts=["cls"], settle_steps=1000, also_steps=1000)
    assert quality.queue(records, args) == [
        ("simcse", "cls", 2, 1000), ("simcse", "cls", 1, None), ("simcse", "cls", 2, None),
        ("simcse", "cls", 1, 1000),
    ]  # fmt: skip
    asked = _plan_args(rows=["simcse"], starts=["cls"], settle_steps=None, also_steps=None)
    assert quality.queue(records, asked) == [("simcse", "cls", 1, None), ("simcse", "cls", 2, None)]
    # DenoSent's runs are recorded under its prompt's start: its rerun is queued once.
    prompt = tmp_path / "prompt"
    late = dict(record("denosent", 1, 78.0, start="mask", best=500), settings={"steps": 500})
    quality.write_json(quality.record_path(prompt, "denosent", "mask", 1), late)
    args = _plan_args(rows=["denosent"], seeds=[1], starts=["cls"], settle_steps=1000,
                      also_steps=1000)  # fmt: skip
    assert quality.queue(prompt, args) == [
        ("denosent", "mask", 1, 1000), ("simcse", "cls", 1, 1000), ("denosent", "cls", 1, None),
    ]  # fmt: skip
    keep("simcse", 1, 300, steps=1000)
    keep("simcse", 2, 600, steps=1000)
    s = table.summarize(quality.load_records(tmp_path / "runs", records))[0]
    assert (s["settled"], s["companion"]) == ({2: 1000}, {1: 1000})
    with pytest.raises(SystemExit):
        quality.main(["--out", str(tmp_path / "out"), "--also-steps", "500", "--table-only"])
