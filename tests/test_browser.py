"""The attention explorer in a real browser: headless Chromium opens the page served by a real `attnkit serve` process,
types, switches views, layers and heads, and what it draws is checked against the arrays the model returns.

Skipped, with what is missing, where Chromium, chromedriver or selenium cannot be had (`.ci/run` installs them)."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.data.glossary import Glossary
from attnkit.decode import DecodeOptions, Translator
from attnkit.viz.attention import load_views, translation_views
from browser import Explorer, chromium, missing, served

if missing():
    pytest.skip(f"no browser for the explorer tests: missing {missing()}", allow_module_level=True)

LINE_MIN = 0.005  # the head view draws lines of at least this weight (explorer.js)
SENTENCE = "dreihundertvierundfünfzig"
TEXT = "ANNA: the cat is here."


@pytest.fixture(scope="module")
def driver():
    d = chromium()
    yield d
    d.quit()


def assert_lines(drawn, weights: np.ndarray, heads=None, query=None) -> None:
    """The head view's lines are exactly the weights (H, Tq, Tk) of at least LINE_MIN, of the heads shown (and of
    one query token when focused), each with its own weight."""
    heads = range(weights.shape[0]) if heads is None else heads
    got = {(h, i, j): w for h, i, j, w in drawn}
    for (h, i, j), w in got.items():
        assert h in heads and (query is None or i == query)
        assert abs(w - weights[h, i, j]) <= 1e-4 and weights[h, i, j] >= LINE_MIN - 1e-4
    for h in heads:
        for i, j in zip(*np.nonzero(weights[h] >= LINE_MIN + 1e-4)):
            if query is None or i == query:
                assert (h, int(i), int(j)) in got, (h, i, j)


def assert_summary(rows: list[dict], weights: np.ndarray, keys: list[str]) -> None:
    """Per query and head: the arg-max key and the entropy in bits, and the same for the mean of the heads."""
    mean = weights.mean(0)
    for i, row in enumerate(rows):
        for head, m in [*((str(h), weights[h]) for h in range(weights.shape[0])), ("mean", mean)]:
            token, entropy = row[head]
            p = m[i][m[i] > 0]
            assert entropy == pytest.approx(float(-(p * np.log2(p)).sum()), abs=2e-3)
            assert token == keys[int(np.argmax(m[i]))] or m[i].max() - m[i][keys.index(token)] < 2e-4


def test_translation_every_view_layer_head_and_hypothesis(driver, family_checkpoints):
    ckpt = family_checkpoints["transformer"]
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    (hyps,) = translation_views(translator, [SENTENCE], DecodeOptions(beam=3, nbest=2))
    with served(ckpt) as url:
        page = Explorer(driver, url)
        page.ask(SENTENCE, beam=3, nbest=2)
        assert page.el("output").text == hyps[0].output
        options = page.js("return [...document.getElementById('hyp').options].map((o) => o.textContent)")
        assert options == [f"{n + 1}. {v.output}   (log-prob {v.score:.3f})" for n, v in enumerate(hyps)]
        view = hyps[0]
        for kind in ("encoder", "decoder", "cross"):  # head view: every layer, all heads
            page.select("kind", kind)
            for layer in range(len(view.maps[kind])):
                page.select("layer", layer)
                assert [t for t, _ in page.tokens("left")] == view.queries[kind]
                assert [t for t, _ in page.tokens("right")] == view.keys[kind]
                assert_lines(page.lines(), view.maps[kind][layer])
        page.select("kind", "cross")
        page.select("layer", 1)
        page.js("document.querySelector('#headview text.tok.left[data-index=\"2\"]').dispatchEvent(new Event('click'))")
        assert_lines(page.lines(), view.maps["cross"][1], query=2)  # a clicked token keeps only its lines
        page.js("document.querySelector('#headboxes .headbox[data-head=\"0\"]').click()")  # hide head 1
        assert_lines(page.lines(), view.maps["cross"][1], heads=[1], query=2)

        page.view("model")  # every layer x head; a click enlarges one in the head view
        thumbs = page.js("return [...document.querySelectorAll('#modelview .thumb')].map((t) => "
                         "[+t.dataset.layer, +t.dataset.head])")
        n_layers, n_heads = len(view.maps["cross"]), view.maps["cross"][0].shape[0]
        assert thumbs == [[layer, h] for layer in range(n_layers) for h in range(n_heads)]
        page.js("document.querySelector('#modelview .thumb[data-layer=\"0\"][data-head=\"1\"]').click()")
        assert page.js("return document.querySelector('#views button.on').dataset.view") == "head"
        assert page.el("layer").get_attribute("value") == "0"
        assert_lines(page.lines(), view.maps["cross"][0], heads=[1])

        page.view("heatmap")
        for head in ("0", "1", "mean"):
            page.select("head", head)
            expected = view.maps["cross"][0].mean(0) if head == "mean" else view.maps["cross"][0][int(head)]
            np.testing.assert_allclose(page.heatmap(), expected, atol=2e-4)

        page.view("summary")
        page.select("kind", "encoder")
        page.select("layer", 1)
        assert_summary(page.summary(), view.maps["encoder"][1], view.keys["encoder"])

        page.select("hyp", 1)  # the second hypothesis: its own text and its own attention
        assert page.el("output").text == hyps[1].output
        page.select("kind", "cross")
        page.view("heatmap")
        page.select("layer", 0)
        page.select("head", "0")
        np.testing.assert_allclose(page.heatmap(), hyps[1].maps["cross"][0][0], atol=2e-4)


def test_transformer_xl_memory_boundary_and_streamed_generation(driver, family_checkpoints, capsys):
    from attnkit.cli.main import main

    ckpt = family_checkpoints["transformer-xl"]
    (view,) = load_views(ckpt, [TEXT])
    m = view.boundary["self"]
    with served(ckpt) as url:
        page = Explorer(driver, url)
        page.ask(TEXT)
        assert page.el("kind").get_attribute("value") == "self"
        right = page.tokens("right")
        assert [t for t, _ in right] == view.keys["self"]
        assert [memory for _, memory in right] == [j < m for j in range(len(right))]
        for layer in range(len(view.maps["self"])):
            page.select("layer", layer)
            assert_lines(page.lines(), view.maps["self"][layer])
        page.view("heatmap")
        page.select("head", "1")
        np.testing.assert_allclose(page.heatmap(), view.maps["self"][-1][1], atol=2e-4)
        edges = page.js("return [...document.querySelectorAll('#grid tr:nth-child(2) td')].map((td, j) => "
                        "td.classList.contains('memory-edge') ? j : -1).filter((j) => j >= 0)")
        assert edges == [m - 1]

        page.fill("text", "BEN: the ")  # stream 30 tokens; the text on screen is `attnkit lm generate`'s
        for name, value in (("length", 30), ("temperature", 0.8), ("seed", 3)):
            page.fill(name, value)
        page.el("generate").click()
        page.wait(lambda d: d.execute_script("return document.getElementById('stream').dataset.state") == "done")
        shown = page.el("stream").get_attribute("textContent")
        assert page.el("stream").get_attribute("data-tokens") == "30"
    assert main(["lm", "generate", "--checkpoint", str(ckpt), "--prompt", "BEN: the ", "--length", "30",
                 "--temperature", "0.8", "--seed", "3", "--device", "cpu"]) == 0
    assert shown + "\n" == capsys.readouterr().out


@pytest.mark.parametrize("kind", ["vanilla-lm", "rnn-bahdanau", "rnn-hard"])
def test_vanilla_lm_and_rnn_soft_and_hard_attention(driver, family_checkpoints, kind):
    ckpt = family_checkpoints[kind]
    text = TEXT if kind == "vanilla-lm" else SENTENCE
    (view,) = load_views(ckpt, [text])
    with served(ckpt) as url:
        page = Explorer(driver, url)
        page.ask(text)
        kinds = page.js("return [...document.getElementById('kind').options].map((o) => o.value)")
        assert kinds == list(view.maps)
        for name in kinds:
            page.select("kind", name)
            page.view("head")
            assert_lines(page.lines(), view.maps[name][0])
            page.view("heatmap")
            np.testing.assert_allclose(page.heatmap(), view.maps[name][0].mean(0), atol=2e-4)
        if kind == "rnn-hard":  # the choices are one-hot, at the arg-max of the distribution they come from
            page.select("kind", "cross")
            heat = np.asarray(page.heatmap())
            assert set(np.unique(heat)) <= {0.0, 1.0}
            page.select("kind", "scores")
            assert np.array_equal(np.asarray(page.heatmap()).argmax(1), heat.argmax(1))


def test_the_glossary_view_says_which_terms_each_hypothesis_uses(driver, family_checkpoints):
    ckpt = family_checkpoints["transformer"]
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    glossary = Glossary.from_pairs([(SENTENCE, "three hundred")])
    (hyps,) = translation_views(translator, [SENTENCE], DecodeOptions(beam=3), glossary=glossary)
    with served(ckpt) as url:
        page = Explorer(driver, url)
        page.ask(SENTENCE, beam=3, glossary=f"{SENTENCE} = three hundred")
        assert page.el("output").text == hyps[0].output and "three hundred" in hyps[0].output
        assert page.el("terms").text == f"glossary: {SENTENCE} \u2192 three hundred \u2713"
