"""Pictures: files are valid PNG / self-contained HTML, and what they show is what the model returned."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch

from attnkit.cli import main
from attnkit.data import BOS_ID, EOS_ID, collate
from attnkit.decode import Translator
from attnkit.nn import sinusoid_table
from attnkit.train.schedules import make_schedule
from attnkit.train.trainer import Trainer
from attnkit.viz import (
    attention_html,
    plot_attention,
    plot_attention_heads,
    plot_curves,
    plot_positions,
    plot_schedule,
    plot_softmax,
    softmax_scaling,
)
from attnkit.viz.attention import seq2seq_views
from attnkit.viz.figure import PNG_SIGNATURE
from attnkit.viz.report import after_fit
from attnkit.viz.softmax import softmax_jacobian
from attnkit.viz.stats import diagonal_hits, diagonal_stats
from conftest import tiny_run_config

SOURCES = ["einundzwanzig", "dreihundertvierundfünfzig"]
TARGETS = ["twenty-one", "three hundred and fifty-four"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir) -> Path:
    """A tiny trained run (the Trainer writes report.html at the end of fit)."""
    out = tmp_path_factory.mktemp("viz") / "run"
    Trainer(tiny_run_config(max_steps=4, max_epochs=1, log_every=1), data_dir, out, progress=False).fit()
    return out


@pytest.fixture(scope="module")
def translator(run_dir) -> Translator:
    return Translator.from_checkpoint(run_dir / "checkpoints" / "best.safetensors", device="cpu")


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) > 50


class PageChecker(HTMLParser):
    """Collects tags and every src/href; fails on anything that would need the network."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.scripts: dict[str, str] = {}
        self._script_id: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        for key in ("src", "href"):
            assert attrs.get(key) is None or attrs[key].startswith("data:"), attrs[key]
        self._script_id = attrs.get("id") if tag == "script" else None

    def handle_endtag(self, tag):
        self._script_id = None

    def handle_data(self, data):
        if self._script_id:
            self.scripts[self._script_id] = self.scripts.get(self._script_id, "") + data


def check_html(path: Path) -> PageChecker:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "http://" not in text and "https://" not in text
    checker = PageChecker()
    checker.feed(text)
    checker.close()
    assert {"html", "head", "body"} <= set(checker.tags)
    return checker


def reference_maps(translator: Translator, source: str, target: str):
    """Straight from the model: Transformer.attention on the encoded pair, plus the tokens."""
    src = np.asarray(translator.src_tok.encode([source])[0])
    tgt = np.asarray(translator.tgt_tok.encode([target])[0])
    batch = collate([(src, tgt)], [0])
    with torch.no_grad():
        _, maps = translator.model.attention(batch.src, batch.tgt_in)
    src_tokens = translator.src_tok.pieces([*src.tolist(), EOS_ID])
    out_tokens = translator.tgt_tok.pieces([*tgt.tolist(), EOS_ID])
    in_tokens = translator.tgt_tok.pieces([BOS_ID, *tgt.tolist()])
    return maps, src_tokens, out_tokens, in_tokens


def labels(ticks) -> list[str]:
    return [t.get_text() for t in ticks]


# --- attention maps ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_attention_grid_shows_the_models_maps_with_token_labels(translator, kind):
    view = seq2seq_views(translator, SOURCES[1:], TARGETS[1:])[0]
    plot = plot_attention(view, kind, None, layer="all")  # the files: test_cli_every_plot_verb
    maps, src, out, inp = reference_maps(translator, SOURCES[1], TARGETS[1])
    queries, keys = {"encoder": (src, src), "decoder": (out, inp), "cross": (out, src)}[kind]
    n_layers, n_heads = len(maps[kind]), maps[kind][0].shape[1]
    axes = plot.figure.axes
    assert len(axes) == n_layers * n_heads
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer * n_heads + head]
            drawn = np.asarray(ax.images[0].get_array())
            np.testing.assert_allclose(drawn, maps[kind][layer][0, head].numpy(), atol=1e-6)
            assert labels(ax.get_xticklabels()) == keys and labels(ax.get_yticklabels()) == queries


def test_one_layer_and_greedy_targets_match_the_translators_attention(translator):
    """Without a target the output is the greedy translation; its teacher-forced cross-attention
    equals what incremental decoding returned step by step."""
    translation = translator.translate(SOURCES[:1], need_attention=True)[0]
    view = seq2seq_views(translator, SOURCES[:1])[0]
    assert view.output == translation.text
    assert view.queries["cross"] == translation.tgt_pieces + ["</s>"]
    plot = plot_attention(view, "cross", None, layer="-1")
    assert plot.data["layers"] == [len(view.maps["cross"]) - 1]
    for head, ax in enumerate(plot.figure.axes):
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()),
                                   translation.attention[:, head].numpy(), atol=1e-5)


def test_plot_attention_heads_keeps_the_demos_signature(tmp_path):
    weights = torch.rand(3, 4, 5).softmax(-1)
    fig = plot_attention_heads(weights, list("abcd"), list("vwxyz"), tmp_path / "h.png", title="t")
    assert_png(tmp_path / "h.png")
    for h in range(3):
        np.testing.assert_allclose(np.asarray(fig.axes[h].images[0].get_array()), weights[h].numpy(), atol=1e-7)
    assert labels(fig.axes[0].get_xticklabels()) == list("vwxyz")


def test_html_page_is_self_contained_and_embeds_the_maps(tmp_path, translator):
    views = seq2seq_views(translator, SOURCES, TARGETS)
    data = attention_html(views, tmp_path / "a.html")
    page = check_html(tmp_path / "a.html")
    assert json.loads(page.scripts["attn-data"]) == data
    for view, sentence in zip(views, data["sentences"]):
        for kind, layers in view.maps.items():
            embedded = sentence["kinds"][kind]
            assert embedded["queries"] == view.queries[kind] and embedded["keys"] == view.keys[kind]
            np.testing.assert_allclose(np.asarray(embedded["layers"]), np.stack(layers), atol=1e-4)


# --- the diagonal statistic -------------------------------------------------------------------
def brute_force_window_share(n_tgt: int, n_src: int, width: float) -> float:
    inside = sum(abs(j - i * n_src / n_tgt) <= width for i in range(n_tgt) for j in range(n_src))
    return inside / (n_tgt * n_src)


@pytest.mark.parametrize(("n_tgt", "n_src"), [(10, 10), (7, 12), (12, 5)])
def test_diagonal_statistic_on_hand_made_attention(n_tgt, n_src):
    diag = np.zeros((n_tgt, n_src))
    diag[np.arange(n_tgt), np.round(np.arange(n_tgt) * n_src / n_tgt).astype(int).clip(max=n_src - 1)] = 1.0
    hits, expected = diagonal_hits(diag)
    assert hits == n_tgt  # a perfectly diagonal matrix: every token on the diagonal
    assert expected / n_tgt == pytest.approx(brute_force_window_share(n_tgt, n_src, 2.0))
    # the anti-diagonal of a long square matrix is mostly off it
    if n_tgt == n_src:
        assert diagonal_hits(diag[::-1])[0] < n_tgt / 2


def test_random_attention_matches_the_analytic_share():
    rng = np.random.default_rng(0)
    n_tgt, n_src, trials = 9, 14, 4000
    hits = sum(diagonal_hits(rng.random((n_tgt, n_src)))[0] for _ in range(trials))
    analytic = brute_force_window_share(n_tgt, n_src, 2.0)
    assert hits / (trials * n_tgt) == pytest.approx(analytic, abs=0.01)


def test_diagonal_stats_per_layer_over_views(translator):
    views = seq2seq_views(translator, SOURCES, TARGETS)
    stats = diagonal_stats(views)
    expected_hits = np.zeros(len(views[0].maps["cross"]))
    tokens = 0
    for v, source, target in zip(views, SOURCES, TARGETS):
        rows, cols = len(translator.tgt_tok.encode([target])[0]), len(translator.src_tok.encode([source])[0])
        tokens += rows
        for layer, m in enumerate(v.maps["cross"]):
            expected_hits[layer] += diagonal_hits(m[:, :rows, :cols].mean(0))[0]
    assert stats.n_tokens == tokens
    np.testing.assert_allclose(stats.shares, expected_hits / tokens)
    diagonal = [v.maps["cross"][0].copy() for v in views]
    for v, m in zip(views, diagonal):  # replace layer 1 with perfectly diagonal attention
        rows, cols = v.content["cross"]
        m[:] = 0.0
        m[:, np.arange(rows), np.round(np.arange(rows) * cols / rows).astype(int)] = 1.0
        v.maps["cross"][0] = m
    assert diagonal_stats(views).shares[0] == 1.0


# --- positions, schedules, curves, softmax ------------------------------------------------------
def test_positions_heatmap_is_the_sinusoid_table(tmp_path):
    plot = plot_positions(tmp_path / "p.png", d_model=32, n_positions=40)
    assert_png(tmp_path / "p.png")
    np.testing.assert_array_equal(np.asarray(plot.figure.axes[0].images[0].get_array()),
                                  sinusoid_table(40, 32).numpy())
    freqs = 10000.0 ** (-np.arange(0, 32, 2) / 32)
    for p, (offsets, dots) in plot.data["dot"].items():
        np.testing.assert_allclose(dots, np.cos(offsets[:, None] * freqs).sum(1), atol=1e-4)  # sum_i cos(k w_i)
        line = next(line for line in plot.figure.axes[1].lines if line.get_label() == f"p = {p}")
        np.testing.assert_array_equal(line.get_ydata(), dots)


@pytest.mark.parametrize("name", ["noam", "inverse_sqrt", "cosine"])
def test_schedule_curve_is_the_schedule(tmp_path, name):
    fn = make_schedule(name, lr=None if name == "noam" else 1e-3, warmup=50, d_model=64, total=300)
    plot = plot_schedule(fn, 300, tmp_path / "s.png" if name == "noam" else None)
    if name == "noam":
        assert_png(tmp_path / "s.png")
    line = plot.figure.axes[0].lines[0]
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, 301))
    np.testing.assert_array_equal(line.get_ydata(), [fn(s) for s in range(1, 301)])


def test_curves_show_the_metrics_csv(tmp_path, run_dir):
    plot = plot_curves([run_dir], tmp_path / "c.png")
    assert_png(tmp_path / "c.png")
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["split"] == "train"]
    x, y = plot.data[f"{run_dir.name}/train/loss/step"]
    np.testing.assert_array_equal(x, [float(r["step"]) for r in train])
    np.testing.assert_array_equal(y, [float(r["loss"]) for r in train])
    x, y = plot.data[f"{run_dir.name}/train/lr/time"]
    np.testing.assert_allclose(x, [float(r["elapsed_s"]) / 60 for r in train])
    np.testing.assert_array_equal(y, [float(r["lr"]) for r in train])
    drawn = [(line.get_xdata(), line.get_ydata()) for ax in plot.figure.axes for line in ax.lines]
    assert any(np.array_equal(dx, x) and np.array_equal(dy, y) for dx, dy in drawn)


def test_softmax_scaling_argument():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    scores = p.log()
    autograd = torch.autograd.functional.jacobian(lambda s: s.softmax(-1), scores)
    torch.testing.assert_close(softmax_jacobian(p), autograd)
    s = softmax_scaling((4, 64, 1024), n_keys=16, n_samples=400)
    np.testing.assert_allclose(s["var_raw"], s["d_k"], rtol=0.15)  # Var(q.k) = d_k
    np.testing.assert_allclose(s["var_scaled"], 1.0, rtol=0.15)
    assert s["pmax_raw"][-1] > 0.9 > s["pmax_scaled"][-1] and s["jac_raw"][-1] < s["jac_scaled"][-1] / 2
    plot = plot_softmax(None, (4, 64, 1024), n_keys=16, n_samples=400)  # the file: test_cli_every_plot_verb
    for ax, key in zip(plot.figure.axes, ("var", "pmax", "jac")):
        np.testing.assert_array_equal(ax.lines[0].get_ydata(), s[f"{key}_raw"])
        np.testing.assert_array_equal(ax.lines[1].get_ydata(), s[f"{key}_scaled"])


# --- report.html --------------------------------------------------------------------------------
def test_training_writes_a_self_contained_report(run_dir):
    page = check_html(run_dir / "report.html")
    text = (run_dir / "report.html").read_text()
    assert text.count('src="data:image/png;base64,') >= 2  # curves + sample attention
    assert "d_model: 16" in text and "valid (last row)" in text
    assert page.tags.count("img") >= 2


def test_report_failure_is_a_warning_not_a_crash(tmp_path):
    said: list[str] = []
    assert after_fit(tmp_path / "missing", None, said.append) is None
    assert len(said) == 1 and said[0].startswith("warning: report.html not written")


# --- the command line ---------------------------------------------------------------------------
def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_every_plot_verb(capsys, tmp_path, run_dir, data_dir):
    ckpt = run_dir / "checkpoints" / "best.safetensors"
    src_file, tgt_file = tmp_path / "s.de", tmp_path / "s.en"
    src_file.write_text("\n".join(SOURCES) + "\n")
    tgt_file.write_text("\n".join(TARGETS) + "\n")
    calls = {
        "a.png": ["attention", "--checkpoint", ckpt, "--src", SOURCES[0], "--out", tmp_path / "a.png"],
        "c.png": ["attention", "--checkpoint", ckpt, "--src", SOURCES[0], "--tgt", TARGETS[0], "--kind", "cross",
                  "--layer", "1", "--out", tmp_path / "c.png"],
        "a.html": ["attention", "--checkpoint", ckpt, "--src-file", src_file, "--html", "--out", tmp_path / "a.html"],
        "p.png": ["positions", "--d-model", "32", "--positions", "50", "--out", tmp_path / "p.png"],
        "s.png": ["schedule", "--config", "multi30k", "--train.warmup=100", "--steps", "500",
                  "--out", tmp_path / "s.png"],
        "cu.png": ["curves", run_dir, run_dir, "--out", tmp_path / "cu.png"],
        "sm.png": ["softmax", "--max-dk", "64", "--samples", "100", "--out", tmp_path / "sm.png"],
        "r.html": ["report", run_dir, "--data", data_dir, "--samples", "1", "--out", tmp_path / "r.html"],
    }
    for name, argv in calls.items():
        code, out, err = run_cli(capsys, "plot", *argv)
        assert code == 0, (name, err)
    for kind in ("encoder", "decoder", "cross"):
        assert_png(tmp_path / f"a-{kind}.png")
    for name in ("c.png", "p.png", "s.png", "cu.png", "sm.png"):
        assert_png(tmp_path / name)
    for name in ("a.html", "r.html"):
        check_html(tmp_path / name)
    code, out, err = run_cli(capsys, "plot", "attention", "--checkpoint", ckpt, "--stats", "--src-file", src_file,
                             "--tgt-file", tgt_file)
    assert code == 0, err
    n_layers = tiny_run_config().model.n_decoder_layers
    table = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [row[0] for row in table[1:]] == [str(i) for i in range(1, n_layers + 1)]


def test_cli_schedule_config_equals_make_schedule(tmp_path):
    import argparse

    from attnkit.plot_cli import add_parsers, schedule_from_args

    sub = argparse.ArgumentParser().add_subparsers(dest="verb")
    add_parsers(sub)
    args = sub.choices["plot"].parse_args(["schedule", "--config", "multi30k", "--warmup", "200"])
    fn, cfg = schedule_from_args(args, ["train.lr=0.002"])
    ref = make_schedule("inverse_sqrt", lr=0.002, warmup=200, d_model=256)  # multi30k: transformer-small
    assert cfg.train.schedule == "inverse_sqrt" and all(fn(s) == ref(s) for s in (1, 199, 200, 201, 5000))


def test_cli_refuses_to_overwrite_and_reports_bad_options(capsys, tmp_path, run_dir):
    ckpt = run_dir / "checkpoints" / "best.safetensors"
    out = tmp_path / "p.png"
    assert run_cli(capsys, "plot", "positions", "--out", out)[0] == 0
    code, _, err = run_cli(capsys, "plot", "positions", "--out", out)
    assert code == 2 and "--force" in err
    assert run_cli(capsys, "plot", "positions", "--out", out, "--force")[0] == 0
    for argv, message in ((["attention", "--checkpoint", ckpt, "--src", "eins", "--layer", "7"], "--layer 7"),
                          (["attention", "--checkpoint", ckpt, "--src", "eins", "--layer", "last"], "--layer last"),
                          (["attention", "--checkpoint", ckpt], "--src"),
                          (["curves", tmp_path], "metrics.csv"),
                          (["positions", "--d-model", "7"], "even")):
        code, _, err = run_cli(capsys, "plot", *argv, "--out", tmp_path / "x.png")
        assert code == 2 and err.startswith("attnkit: error: ") and message in err, err
