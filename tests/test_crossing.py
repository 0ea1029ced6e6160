"""Where two validation curves cross (`attnkit plot crossing`): the minute against a dense naive scan, the picture's
arrays against the metrics.csv they come from, and the command over lm-ablation folders."""

import csv
import json
import math

import numpy as np
import pytest

from attnkit.cli.main import main
from attnkit.errors import AttnkitError
from attnkit.viz.curves import CurveGroup, crossing_minute, plot_crossing, valid_curve


def naive_crossing(a, b, step=1e-4):
    """The first minute of a dense grid after which a is never above b (both linear between their points)."""
    lo, hi = max(a[0][0], b[0][0]), min(a[0][-1], b[0][-1])
    grid = np.arange(lo, hi + step / 2, step)
    behind = np.flatnonzero(np.interp(grid, *a) - np.interp(grid, *b) > 1e-12)
    if behind.size == 0:
        return grid[0]
    return math.inf if behind[-1] == grid.size - 1 else grid[behind[-1] + 1]


def curve(minutes, loss):
    return np.asarray(minutes, dtype=float), np.asarray(loss, dtype=float)


CASES = {
    "crosses once": (curve([1, 3, 6, 9], [8, 6, 3, 2]), curve([0.5, 2, 4, 8, 10], [5, 4.5, 4.2, 4.0, 3.9])),
    "ahead throughout": (curve([1, 2, 3], [1, 1, 1]), curve([1, 2, 3], [2, 2, 2])),
    "never ahead": (curve([1, 2, 3], [3, 2.5, 2.2]), curve([1, 2, 3], [2, 2, 2])),
    "ahead, behind, ahead": (curve([0, 2, 4, 6, 8], [3, 1, 3, 1, 0.5]), curve([0, 8], [2, 2])),
    "behind again at the end": (curve([0, 2, 4], [3, 1, 3]), curve([0, 4], [2, 2])),
    "other minutes": (curve([0.7, 1.9, 3.3, 5.2, 7.4], [9, 7, 4.4, 3.1, 2.9]), curve([0.2, 2.5, 6.0], [6, 4, 3.0])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_crossing_minute_is_the_dense_scans(name):
    a, b = CASES[name]
    want, got = naive_crossing(a, b), crossing_minute(a, b)
    assert got == want if math.isinf(want) else got == pytest.approx(want, abs=2e-4)


def test_crossing_minute_refuses_curves_without_common_minutes():
    with pytest.raises(AttnkitError, match="share no minutes"):
        crossing_minute(curve([0, 1], [1, 1]), curve([2, 3], [1, 1]))


def write_run(run_dir, minutes, nll):
    run_dir.mkdir(parents=True)
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["split", "step", "elapsed_s", "loss", "nll", "ppl"])
        for i, (m, v) in enumerate(zip(minutes, nll)):
            w.writerow(["train", 10 * i + 5, m * 60 - 1, v + 0.5, v + 0.5, ""])  # train rows are not drawn
            w.writerow(["valid", 10 * i + 10, m * 60, v, v, math.exp(v)])


def test_plot_crossing_draws_each_groups_validation_curves(tmp_path):
    xl, lstm = CASES["crosses once"]
    write_run(tmp_path / "xl", *xl)
    write_run(tmp_path / "lstm", *lstm)
    assert np.array_equal(valid_curve(tmp_path / "xl")[1], xl[1])
    chars = CurveGroup("chars", "char", {"xl": tmp_path / "xl", "lstm": tmp_path / "lstm"}, ("lstm",))
    words = CurveGroup("words", "word", {"xl": tmp_path / "xl", "lstm": tmp_path / "lstm"}, ("lstm",))
    plot, crossings = plot_crossing([chars, words], tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes().startswith(b"\x89PNG")
    assert np.allclose(plot.data["chars/xl"][0], xl[0]) and np.allclose(plot.data["chars/xl"][1], xl[1] / math.log(2))
    assert np.allclose(plot.data["words/lstm"][1], np.exp(lstm[1]))
    assert [(c.group, c.model, c.baseline) for c in crossings] == [("chars", "xl", "lstm"), ("words", "xl", "lstm")]
    assert crossings[0].minute == pytest.approx(naive_crossing(xl, lstm), abs=2e-4)
    assert crossings[1].model_last == pytest.approx(math.exp(2)) and crossings[1].minutes == 9


def test_cli_crossing_reads_lm_ablation_folders(tmp_path, capsys):
    for corpus, (a, b) in {"tiny-shakespeare": CASES["crosses once"], "wikitext-2": CASES["never ahead"]}.items():
        out = tmp_path / corpus
        write_run(out / "xl", *a)
        write_run(out / "lstm", *b)
        (out / "data").mkdir()
        (out / "data" / "prepared_from.json").write_text(json.dumps({"corpus": corpus}))
        models = [{"name": "xl", "kind": "transformer-xl"}, {"name": "lstm", "kind": "lstm-lm"}]
        (out / "lm_ablation.json").write_text(json.dumps({"level": "char", "models": models}))
    assert main(["plot", "crossing", str(tmp_path / "tiny-shakespeare"), str(tmp_path / "wikitext-2"),
                 "--out", str(tmp_path / "c.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    minute = naive_crossing(*CASES["crosses once"])
    assert lines[2].startswith(f"| tiny-shakespeare | xl | lstm | {minute:.1f} |")
    assert lines[3].startswith("| wikitext-2 | xl | lstm | not within the runs |")
    assert main(["plot", "crossing", str(tmp_path / "xl"), "--out", str(tmp_path / "d.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit: error: ") and "no finished lm-ablation" in err and len(err.splitlines()) == 1
