"""Pictures: files are valid PNG / self-contained HTML, and what they show is what the model returned."""

from __future__ import annotations

import csv
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch

from attnkit.cli.main import main
from attnkit.data import BOS_ID, EOS_ID, collate, read_lines
from attnkit.decode import Translator
from attnkit.errors import AttnkitError
from attnkit.nn import sinusoid_table
from attnkit.train.schedules import make_schedule
from attnkit.train.trainer import Trainer
from attnkit.viz import (
    plot_attention,
    plot_attention_heads,
    plot_curves,
    plot_positions,
    plot_schedule,
    plot_softmax,
    softmax_scaling,
    write_explorer,
)
from attnkit.viz.attention import seq2seq_views
from attnkit.viz.figure import PNG_SIGNATURE
from attnkit.viz.positions import rotation, shift_maps, shift_residuals
from attnkit.viz.report import after_fit, dev_attention_figure
from attnkit.viz.softmax import softmax_jacobian, two_to_one_logits
from attnkit.viz.stats import diagonal_hits, diagonal_stats
from conftest import LM_TEXT, LM_TINY, tiny_run_config

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
    text = path.read_text(encoding="utf-8").replace("'http://www.w3.org/2000/svg'", "")  # a name, not a fetch
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


def test_explorer_page_is_self_contained_and_embeds_the_maps(tmp_path, translator):
    views = seq2seq_views(translator, SOURCES, TARGETS)
    data = write_explorer([[v] for v in views], tmp_path / "a.html", title="t", model="transformer",
                          task="translation")
    page = check_html(tmp_path / "a.html")
    assert json.loads(page.scripts["explorer-data"]) == data and "explorer-live" not in page.scripts
    for view, item in zip(views, data["items"]):
        (hyp,) = item["hypotheses"]
        assert item["source"] == view.source and hyp["text"] == view.output
        for kind, layers in view.maps.items():
            embedded = hyp["kinds"][kind]
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


def test_two_to_one_logits_saturate_and_their_gradient_vanishes():
    """The walk-through's three logits [a, a, 2a]: the largest probability is 1 / (1 + 2 e^-a), the Jacobian
    (the gradient reaching the scores) is autograd's, and it falls by orders of magnitude as a grows."""
    a = np.array([0.0, 1.0, 4.0, 8.0, 16.0])
    f = two_to_one_logits(a)
    np.testing.assert_allclose(f["pmax"], 1 / (1 + 2 * np.exp(-a)), rtol=1e-12)
    np.testing.assert_allclose(f["pother"], 1 / (2 + np.exp(a)), rtol=1e-12)
    for value, norm in zip(a, f["jac"]):
        logits = torch.tensor([value, value, 2 * value], dtype=torch.float64)
        jacobian = torch.autograd.functional.jacobian(lambda s: s.softmax(-1), logits)
        assert math.isclose(torch.linalg.matrix_norm(jacobian).item(), norm, rel_tol=1e-9)
    assert (np.diff(f["jac"]) < 0).all() and f["jac"][0] > 0.4 and f["jac"][3] < 2e-3 and f["jac"][4] < 1e-6
    plot = plot_softmax(None, (4, 256), n_keys=8, n_samples=50)
    probs, grads = plot.figure.axes[3:5]  # the bottom row, drawn up to a = sqrt(max d_k) = 16
    curve = plot.data["two_to_one"]
    assert curve["a"][-1] == 16.0
    np.testing.assert_array_equal(probs.lines[0].get_ydata(), curve["pmax"])
    np.testing.assert_array_equal(grads.lines[0].get_ydata(), curve["jac"])
    assert [line.get_xdata()[0] for line in grads.lines[1:]] == [16.0]  # a = sqrt(256) marked


def test_sinusoidal_positions_are_a_fixed_rotation_of_each_other(tmp_path):
    """PE[p + k] = PE[p] R_k for every p: the least-squares map leaves float32 rounding for sinusoids and almost
    everything for a random table; on the fast dimensions the fitted map is the block rotation itself."""
    offsets = np.arange(1, 30)
    res = shift_residuals(32, 200, offsets)
    assert res["sinusoid"].max() < 1e-5 and res["random"].min() > 0.5
    table = sinusoid_table(240, 32).double().numpy()
    for k in (1, 7):
        np.testing.assert_allclose(table[:-k] @ rotation(32, k), table[k:], atol=1e-4)
    maps, residuals = shift_maps(table, 200, [7])
    np.testing.assert_allclose(maps[0][:8, :8], rotation(32, 7)[:8, :8], atol=1e-4)
    fitted, *_ = np.linalg.lstsq(table[:200], table[7:207], rcond=None)  # the same fit, numpy's way
    assert math.isclose(residuals[0], np.linalg.norm(table[:200] @ fitted - table[7:207]) / np.linalg.norm(
        table[7:207]), rel_tol=0.1, abs_tol=1e-9)
    plot = plot_positions(tmp_path / "p.png", d_model=32, n_positions=40, linear=True, offset=7, fit_positions=200)
    assert_png(tmp_path / "p.png")
    drawn = plot.figure.axes[3].lines
    np.testing.assert_array_equal(drawn[0].get_ydata(), plot.data["residuals"]["sinusoid"])
    np.testing.assert_array_equal(drawn[1].get_ydata(), plot.data["residuals"]["random"])
    np.testing.assert_array_equal(plot.figure.axes[2].images[0].get_array(), plot.data["map"][:10, :10])  # 2 periods
    assert plot.data["map_error"] < 1e-3
    with pytest.raises(AttnkitError, match="must exceed"):
        shift_residuals(32, 32, offsets)


# --- report.html --------------------------------------------------------------------------------
def test_training_writes_a_self_contained_report(run_dir):
    page = check_html(run_dir / "report.html")
    text = (run_dir / "report.html").read_text()
    assert text.count('src="data:image/png;base64,') >= 2  # curves + sample attention
    assert "d_model: 16" in text and "valid (last row)" in text
    assert page.tags.count("img") >= 2


def test_training_writes_the_dev_attention_into_tensorboard(run_dir, data_dir, translator):
    """After every epoch the trainer draws the first dev sentence's attention (report.html's picture) into the
    run's TensorBoard log, beside the scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert "attention/dev sentence" in events.Tags()["images"]
    images = events.Images("attention/dev sentence")
    steps = [int(r["step"]) for r in csv.DictReader((run_dir / "metrics.csv").open()) if r["split"] == "valid"]
    assert [im.step for im in images] == steps and len(images) >= 1  # one per epoch, at its step
    png = images[-1].encoded_image_string
    assert png[:8] == PNG_SIGNATURE and images[-1].width > 100 and images[-1].height > 100
    first = read_lines(data_dir / "valid.src.txt")[0]  # the last image shows the final weights: best == last here
    fig = dev_attention_figure(translator, data_dir)
    assert fig.texts[0].get_text().startswith(first) and fig.axes[0].images[0].get_array().shape[1] == len(
        translator.src_tok.pieces(translator.encode_sources([first])[0].tolist())) + 1


def test_the_dev_attention_draws_a_sentence_with_dollar_signs_as_written(data_dir, translator):
    """matplotlib reads $...$ as TeX: "drei $\\frac{$ vier" failed to draw and the picture was skipped."""
    from attnkit.viz.figure import png_bytes

    fig = dev_attention_figure(translator, data_dir, title="drei $\\frac{$ vier")
    assert png_bytes(fig)[:8] == PNG_SIGNATURE and fig.texts[0].get_text() == "drei $\\frac{$ vier"


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

    from attnkit.cli.plot import add_parsers, schedule_from_args

    sub = argparse.ArgumentParser().add_subparsers(dest="verb")
    add_parsers(sub)
    args = sub.choices["plot"].parse_args(["schedule", "--config", "multi30k", "--warmup", "200"])
    fn, cfg, steps = schedule_from_args(args, ["train.lr=0.002"])
    ref = make_schedule("inverse_sqrt", lr=0.002, warmup=200, d_model=256)  # multi30k: transformer-small
    assert cfg.train.schedule == "inverse_sqrt" and all(fn(s) == ref(s) for s in (1, 199, 200, 201, 5000))
    assert steps == 2000  # 10 x warmup


def test_cli_schedule_draws_a_time_horizon_over_the_drawn_updates():
    import argparse

    from attnkit.cli.plot import add_parsers, schedule_from_args

    sub = argparse.ArgumentParser().add_subparsers(dest="verb")
    add_parsers(sub)
    args = sub.choices["plot"].parse_args(["schedule", "--config", "lm-char-small", "--steps", "3000"])
    fn, cfg, steps = schedule_from_args(args, [])
    t = cfg.train
    assert t.horizon == "time" and t.max_steps == 0 and steps == 3000
    ref = make_schedule("cosine", lr=t.lr, warmup=t.warmup, d_model=cfg.model.d_model, by_time=True)
    assert all(fn(s) == ref(s, spent=s / 3000) for s in (1, t.warmup, 1500, 2999, 3000))  # as training computes it
    assert fn(3000) < fn(1500) < fn(t.warmup)


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


# --- language models and RNNs -------------------------------------------------------------------
LM_PROMPT = "ANNA: the cat is here."
VISIBLE_SPACE = "\u2423"  # how a space token is labelled


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory) -> Path:
    from attnkit.data.lm import prepare_lm

    root = tmp_path_factory.mktemp("lmviz")
    (root / "text.txt").write_text(LM_TEXT * 4, encoding="utf-8")
    prepare_lm(root / "data", root / "text.txt", level="char", valid_fraction=0.2)
    return root / "data"


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory, lm_data) -> dict[str, Path]:
    """Tiny trained Transformer-XL and vanilla LM runs (the LM trainer writes report.html at the end)."""
    from attnkit import config as cfgmod
    from attnkit.train.lm_trainer import LMTrainer

    runs = {}
    for kind, preset in (("transformer-xl", "lm-char-small-xl"), ("vanilla-lm", "lm-char-small-vanilla")):
        cfg = cfgmod.resolve([preset], LM_TINY, cls=cfgmod.LMRunConfig)
        runs[kind] = tmp_path_factory.mktemp("lmrun") / kind
        LMTrainer(cfg, lm_data, runs[kind], progress=False).fit()
    return runs


def lm_reference(ckpt: Path, text: str, m: int):
    """Straight from the model: the first m characters read as memory, the rest with need_weights=True."""
    from attnkit.checkpoint import load_lm_checkpoint

    model, vocab, cfg = load_lm_checkpoint(ckpt)
    x = torch.as_tensor(vocab.encode([text])[:-1], dtype=torch.long)[None]  # (1, N), no end-of-line token
    with torch.no_grad():
        mems = model(x[:, :m], None, mem_len=m)[1] if m else None
        weights = model(x[:, m:], mems, mem_len=m, clamp_len=cfg.train.clamp_len, need_weights=True)[2]
    return [w[0].numpy() for w in weights]  # L x (H, T, M + T)


def assert_grid_equals(plot, maps: list[np.ndarray], queries: list[str], keys: list[str]) -> None:
    n_heads = maps[0].shape[0]
    assert len(plot.figure.axes) == len(maps) * n_heads
    for layer, weights in enumerate(maps):
        for head in range(n_heads):
            ax = plot.figure.axes[layer * n_heads + head]
            np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), weights[head], atol=1e-6)
            assert labels(ax.get_xticklabels()) == keys and labels(ax.get_yticklabels()) == queries


def memory_lines(ax) -> list[float]:
    return [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--"]


@pytest.mark.parametrize(("mem_len", "m"), [(None, len(LM_PROMPT) // 2), (5, 5), (0, 0)])
def test_transformer_xl_view_is_its_attention_over_memory_and_segment(lm_runs, mem_len, m):
    from attnkit.viz import load_views

    ckpt = lm_runs["transformer-xl"] / "checkpoints" / "best.safetensors"
    view = load_views(ckpt, [LM_PROMPT], mem_len=mem_len)[0]
    tokens = [VISIBLE_SPACE if c == " " else c for c in LM_PROMPT]
    plot = plot_attention(view, "self", None)
    maps = lm_reference(ckpt, LM_PROMPT, m)
    assert maps[0].shape[1:] == (len(LM_PROMPT) - m, len(LM_PROMPT))
    assert_grid_equals(plot, maps, tokens[m:], tokens)
    assert view.boundary == ({"self": m} if m else {}) and view.source == LM_PROMPT
    for ax in plot.figure.axes:
        assert memory_lines(ax) == ([m - 0.5] if m else [])


def test_vanilla_lm_view_is_its_causal_attention(lm_runs):
    from attnkit.checkpoint import load_checkpoint
    from attnkit.viz import load_views

    ckpt = lm_runs["vanilla-lm"] / "checkpoints" / "best.safetensors"
    view = load_views(ckpt, [LM_PROMPT])[0]
    plot = plot_attention(view, "self", None, layer="-1")
    window = LM_PROMPT[-load_checkpoint(ckpt).config.train.tgt_len :]  # the positions it was trained on
    tokens = [VISIBLE_SPACE if c == " " else c for c in window]
    assert_grid_equals(plot, lm_reference(ckpt, window, 0)[-1:], tokens, tokens)
    assert not view.boundary and not any(memory_lines(ax) for ax in plot.figure.axes)
    assert np.triu(view.maps["self"][0], 1).max() == 0.0  # causal: nothing above the diagonal


def test_lm_explorer_page_embeds_the_self_attention_and_the_boundary(tmp_path, lm_runs):
    from attnkit.viz import load_views

    views = load_views(lm_runs["transformer-xl"] / "checkpoints" / "best.safetensors", [LM_PROMPT, "BEN: sea"])
    data = write_explorer([[v] for v in views], tmp_path / "lm.html", title="t", model="transformer-xl", task="lm")
    page = check_html(tmp_path / "lm.html")
    assert json.loads(page.scripts["explorer-data"]) == data
    for view, item in zip(views, data["items"]):
        embedded = item["hypotheses"][0]["kinds"]["self"]
        assert embedded["boundary"] == view.boundary["self"] and embedded["keys"] == view.keys["self"]
        np.testing.assert_allclose(np.asarray(embedded["layers"]), np.stack(view.maps["self"]), atol=1e-4)


def test_lm_runs_write_a_report_with_snippet_attention(lm_runs):
    for run in lm_runs.values():
        text = (run / "report.html").read_text()
        check_html(run / "report.html")
        assert text.count('src="data:image/png;base64,') >= 2 and "validation snippets" in text  # curves + samples
        assert "warning" not in (run / "train.log").read_text()


def test_cli_draws_language_models(capsys, tmp_path, lm_runs, lm_data):
    xl = lm_runs["transformer-xl"] / "checkpoints" / "best.safetensors"
    vanilla = lm_runs["vanilla-lm"] / "checkpoints" / "best.safetensors"
    src_file = tmp_path / "lm.txt"
    src_file.write_text(f"{LM_PROMPT}\nBEN: the sea\n")
    for argv in (["--checkpoint", xl, "--src", LM_PROMPT, "--mem-len", "6", "--out", tmp_path / "xl.png"],
                 ["--checkpoint", vanilla, "--src", LM_PROMPT, "--kind", "self", "--layer", "1",
                  "--out", tmp_path / "v.png"]):
        code, out, err = run_cli(capsys, "plot", "attention", *argv)
        assert code == 0, err
        assert_png(Path(argv[-1]))
    assert "self: 6 memory tokens | 16 segment tokens" in run_cli(capsys, "plot", "attention", "--checkpoint", xl,
                                                                  "--src", LM_PROMPT, "--mem-len", "6", "--out",
                                                                  tmp_path / "xl.png", "--force")[1]
    code, _, err = run_cli(capsys, "plot", "attention", "--checkpoint", xl, "--src-file", src_file, "--html",
                           "--out", tmp_path / "xl.html")
    assert code == 0, err
    check_html(tmp_path / "xl.html")
    code, _, err = run_cli(capsys, "plot", "report", lm_runs["vanilla-lm"], "--data", lm_data, "--out",
                           tmp_path / "r.html")
    assert code == 0, err
    check_html(tmp_path / "r.html")
    for argv, message in (([xl, "--src-file", src_file, "--stats"], "--stats"),
                          ([xl, "--src", LM_PROMPT, "--tgt", "x"], "--tgt"),
                          ([xl, "--src", LM_PROMPT, "--mem-len", "22"], "--mem-len 22"),
                          ([vanilla, "--src", LM_PROMPT, "--mem-len", "4"], "no memory"),
                          ([xl, "--src", LM_PROMPT, "--kind", "cross"], "no 'cross' attention"),
                          ([xl, "--src", LM_PROMPT], "already exists")):
        code, _, err = run_cli(capsys, "plot", "attention", "--checkpoint", *argv, "--out", tmp_path / "xl.png")
        assert code == 2 and err.startswith("attnkit: error: ") and message in err and err.count("\n") == 1, err


@pytest.fixture(scope="module")
def rnn_runs(tmp_path_factory, data_dir) -> dict[str, Path]:
    """Tiny trained RNN runs: the three attentive kinds and the fixed-vector model."""
    from attnkit.config import RNNConfig, RunConfig, TrainConfig

    runs = {}
    for kind in ("rnn-bahdanau", "rnn-luong", "rnn-hard", "rnn-seq2seq"):
        cfg = RunConfig(model=RNNConfig(kind=kind, src_vocab_size=40, tgt_vocab_size=40, embed_dim=12, hidden=16),
                        train=TrainConfig(max_tokens=300, lr=3e-3, schedule="constant", eval_bleu=False,
                                          max_steps=2, eval_max_sentences=4, device="cpu"))
        runs[kind] = tmp_path_factory.mktemp("rnnrun") / kind
        Trainer(cfg, data_dir, runs[kind], progress=False).fit()
    return runs


@pytest.mark.parametrize("kind", ["rnn-bahdanau", "rnn-luong", "rnn-hard"])
def test_rnn_view_is_its_alignment_matrix(rnn_runs, kind):
    t = Translator.from_checkpoint(rnn_runs[kind] / "checkpoints" / "best.safetensors", device="cpu")
    view = seq2seq_views(t, SOURCES[1:], TARGETS[1:])[0]
    hard = kind == "rnn-hard"
    assert list(view.maps) == (["cross", "scores"] if hard else ["cross"])
    plot = plot_attention(view, "cross", None)
    maps, src, out, _ = reference_maps(t, SOURCES[1], TARGETS[1])
    assert list(maps) == list(view.maps) and maps["cross"][0].shape[:2] == (1, 1)
    if hard:  # in eval mode each choice is the arg-max of the distribution it is drawn from (B, 1, T, S)
        choices, scores = maps["cross"][0], maps["scores"][0]
        assert torch.equal(choices.argmax(-1), scores.argmax(-1)) and torch.all(choices.sum(-1) == 1)
        torch.testing.assert_close(scores.sum(-1), torch.ones_like(scores.sum(-1)))
    assert_grid_equals(plot, [maps["cross"][0][0].numpy()], out, src)
    greedy = seq2seq_views(t, SOURCES[:1])[0]  # without a target: the greedy translation, teacher-forced back
    assert greedy.output == t.translate(SOURCES[:1])[0].text


def test_rnn_runs_write_reports_with_or_without_attention(rnn_runs):
    for kind, run in rnn_runs.items():
        text = (run / "report.html").read_text()
        check_html(run / "report.html")
        assert text.count('src="data:image/png;base64,') == (1 if kind == "rnn-seq2seq" else 4)  # curves (+ 3)
        assert ("no attention to draw" in text) == (kind == "rnn-seq2seq")
        assert "warning" not in (run / "train.log").read_text()


def test_cli_draws_rnn_alignments(capsys, tmp_path, rnn_runs):
    ckpt = rnn_runs["rnn-bahdanau"] / "checkpoints" / "best.safetensors"
    src_file = tmp_path / "s.de"
    src_file.write_text("\n".join(SOURCES) + "\n")
    for argv in (["--src", SOURCES[0], "--out", tmp_path / "a.png"],
                 ["--src", SOURCES[0], "--tgt", TARGETS[0], "--kind", "cross", "--out", tmp_path / "c.png"],
                 ["--src-file", src_file, "--html", "--out", tmp_path / "a.html"]):
        code, _, err = run_cli(capsys, "plot", "attention", "--checkpoint", ckpt, *argv)
        assert code == 0, err
    assert_png(tmp_path / "a.png")  # one kind: no kind suffix
    assert_png(tmp_path / "c.png")
    check_html(tmp_path / "a.html")
    code, out, err = run_cli(capsys, "plot", "attention", "--checkpoint", ckpt, "--stats", "--src-file", src_file)
    assert code == 0, err
    table = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [row[0] for row in table[1:]] == ["1"]
    fixed = rnn_runs["rnn-seq2seq"] / "checkpoints" / "best.safetensors"
    for argv, message in (([ckpt, "--src", SOURCES[0], "--kind", "enc"], "no 'encoder' attention"),
                          ([ckpt, "--src", SOURCES[0], "--mem-len", "3"], "--mem-len"),
                          ([fixed, "--src", SOURCES[0]], "no attention"),
                          ([fixed, "--src-file", src_file, "--stats"], "no attention")):
        code, _, err = run_cli(capsys, "plot", "attention", "--checkpoint", *argv, "--out", tmp_path / "x.png")
        assert code == 2 and err.startswith("attnkit: error: ") and message in err and err.count("\n") == 1, err
