"""benchmarks/ab.py's arithmetic and its reading of metrics.csv, without running a benchmark: the ratio is oriented so
that above 1 means the second version is better (more tok/s, fewer ms an update), its interval holds the rounds'
geometric mean, and the table counts every figure but the machine's control in its summary."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ab.py"


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("ab_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ab_script"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_ratios_are_oriented_and_the_interval_holds_the_mean(ab):
    speed = ab.Figure("tok/s", values={"before": [100.0, 110.0, 90.0], "after": [110.0, 121.0, 99.0]})
    assert ab.ratios(speed) == pytest.approx([1.1, 1.1, 1.1])
    mean, low, high = ab.spread(ab.ratios(speed))
    assert mean == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)
    time = ab.Figure("ms", higher_is_better=False, values={"before": [200.0, 210.0], "after": [100.0, 140.0]})
    rs = ab.ratios(time)
    assert rs == pytest.approx([2.0, 1.5])
    mean, low, high = ab.spread(rs)
    assert mean == pytest.approx(math.sqrt(3.0)) and low < mean < high
    assert ab.spread([1.25]) == (pytest.approx(1.25),) * 3  # one round: no interval


def test_table_summarises_all_but_the_control(ab):
    figs = [ab.Figure("a", values={"before": [100.0], "after": [95.0]}, rss={"before": [500.0], "after": [510.0]}),
            ab.Figure("b", values={"before": [100.0], "after": [105.0]}),
            ab.Figure("peak", control=True, values={"before": [100.0], "after": [50.0]})]
    text = ab.table(figs, "old", "new")
    assert "500 → 510 (1.020×)" in text and "peak (control)" in text
    assert f"2 figures: geometric mean of the ratios **{math.sqrt(0.95 * 1.05):.3f}×**, smallest 0.950×" in text


def test_metrics_csv_gives_the_mean_step_and_the_budget_figures(ab, tmp_path):
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("step,split,elapsed_s,loss,bleu\n0,train,0.0,9,\n50,train,10.0,5,\n100,train,20.0,4,\n"
                       "100,valid,21.0,4,30.5\n150,train,32.0,3,\n150,valid,33.0,3,31.25\n")
    assert ab.step_ms(metrics) == pytest.approx(1e3 * 22.0 / 100)
    assert ab.budget_figures(metrics) == (150, 31.25, "bleu")


def test_a_checkout_folder_is_used_as_it_is(ab, tmp_path):
    (tmp_path / "src" / "attnkit").mkdir(parents=True)
    assert ab.checkout(str(tmp_path), tmp_path / "unused") == tmp_path.resolve()
    assert ab.prepare_args("lm-word-wt2")[0] == "wt2" and ab.prepare_args("tatoeba-en-zh")[1][2:5:2] == ["en", "zh"]


def test_a_bad_version_or_a_failed_step_is_one_line(ab, tmp_path):
    with pytest.raises(SystemExit, match=r"^nosuchrev: neither a checkout's folder nor a git revision \(.+\)$"):
        ab.checkout("nosuchrev", tmp_path / "tree")
    log = tmp_path / "train.log"
    log.write_text("starting\nattnkit: error: unknown preset 'x'\n\n")
    error = ab.failed("before", "training", 2, log)
    assert str(error) == f"before: training exited with 2: attnkit: error: unknown preset 'x' ({log})"
