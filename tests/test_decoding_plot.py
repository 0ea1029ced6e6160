"""Teacher forcing vs step-by-step inference (`attnkit plot decoding`): on the greedy output the two paths
compute the same log-probabilities, for every seq2seq family; on another target they part at its first change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.cli.main import main
from attnkit.config import RNNConfig
from attnkit.data import EOS_ID
from attnkit.decode import Translator
from attnkit.models import build_model
from attnkit.viz.decoding import decoding_trace, plot_decoding
from attnkit.viz.figure import PNG_SIGNATURE

SOURCE = "dreihundertvierundfünfzig"


@pytest.fixture(scope="module")
def transformer(trained) -> Translator:
    return Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", device="cpu")


def rnn(transformer: Translator, kind: str) -> Translator:
    """An untrained RNN with the Transformer's vocabulary: the equality holds for any weights."""
    v = transformer.model.config.src_vocab_size
    torch.manual_seed(0)
    model = build_model(kind, RNNConfig(kind=kind, src_vocab_size=v, tgt_vocab_size=v, embed_dim=16, hidden=16,
                                        dropout=0.0))
    return Translator(model, transformer.src_tok, transformer.tgt_tok, max_len_a=0.5, max_len_b=4)


def finite_close(a: np.ndarray, b: np.ndarray) -> None:
    assert np.array_equal(np.isfinite(a), np.isfinite(b))
    np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", ["transformer", "rnn-bahdanau", "rnn-seq2seq"])
def test_teacher_forcing_on_the_greedy_output_reproduces_inference(transformer, kind):
    translator = transformer if kind == "transformer" else rnn(transformer, kind)
    trace = decoding_trace(translator, SOURCE)
    greedy = translator.translate([SOURCE])[0]  # the library's greedy search: the trace's loop is the same search
    assert trace.label([t for t in trace.step_outputs if t != EOS_ID]) == greedy.tgt_pieces
    assert trace.step_inputs[1:] == trace.step_outputs[: len(trace.step_inputs) - 1]  # each step reads the last choice
    assert trace.step_outputs[-1] == EOS_ID  # at the latest where the length limit forces it
    assert trace.forced_inputs == trace.step_inputs  # BOS + the output without its EOS
    finite_close(trace.forced_logp[: trace.compared], trace.step_logp[: trace.compared])
    assert trace.forced_outputs[: trace.compared] == trace.step_outputs[: trace.compared]
    assert trace.first_input_difference() is None and trace.differing_predictions() == []
    assert trace.gaps().max() < 1e-4
    if kind == "transformer":  # the causal mask: nothing above the diagonal, each row a distribution
        w = trace.self_attention
        assert w.shape == (len(trace.forced_inputs),) * 2 and np.triu(w, 1).max() == 0
        np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-5)
    else:
        assert trace.self_attention is None


def test_another_target_parts_from_inference_at_its_first_change(transformer):
    trace = decoding_trace(transformer, SOURCE)
    tokens = [t for t in trace.step_outputs if t != EOS_ID]
    changed = next(i for i in range(len(tokens)) if transformer.tgt_tok.pieces([tokens[i]])[0] != "▁")
    replacement = next(p for p in ("▁four", "▁three", "▁and") if p != transformer.tgt_tok.pieces([tokens[changed]])[0])
    target_pieces = transformer.tgt_tok.pieces(tokens)
    target_pieces[changed] = replacement
    other = decoding_trace(transformer, SOURCE, "".join(target_pieces).replace("▁", " ").strip())
    assert other.forced_inputs[1 : changed + 1] == trace.step_inputs[1 : changed + 1]
    assert other.first_input_difference() == changed + 1  # position changed + 1 reads the changed token
    assert other.gaps()[: changed + 1].max() < 1e-4  # the same prefix: the same log-probs
    assert any(line.startswith(f"position {changed + 2}: teacher forcing reads") for line in other.summary())


def test_the_picture_and_the_command(tmp_path, capsys, trained, transformer):
    trace = decoding_trace(transformer, SOURCE)
    plot = plot_decoding(trace, tmp_path / "d.png")
    assert (tmp_path / "d.png").read_bytes()[:8] == PNG_SIGNATURE
    steps, forced, gaps = plot.figure.axes[:3]
    n = len(trace.step_inputs)
    grid = np.asarray(steps.images[0].get_array())
    assert grid.shape == (n, n) and (np.diag(grid) == 1.0).all()  # row t: the token fed at step t
    assert [t.get_text() for t in steps.get_xticklabels()] == trace.label(trace.step_inputs)
    below = np.tril_indices(len(trace.forced_inputs))  # the mask's open part shows the self-attention
    np.testing.assert_array_equal(np.asarray(forced.images[0].get_array())[below], trace.self_attention[below])
    bars = sorted((p.get_x() + p.get_width() / 2, p.get_height()) for p in gaps.patches)  # (position, gap)
    np.testing.assert_allclose(bars, [(i + 1, max(g, 1e-12)) for i, g in enumerate(trace.gaps())], rtol=1e-6)
    out = tmp_path / "cli.png"
    code = main(["plot", "decoding", "--checkpoint", str(trained[1] / "checkpoints" / "last.safetensors"),
                 "--src", SOURCE, "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and out.read_bytes()[:8] == PNG_SIGNATURE
    assert "predictions agree at every position both computed" in printed and f"wrote {out}" in printed
