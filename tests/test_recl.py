"""Relative effective context length (attnkit.eval.recl) on synthetic groups whose answer is known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit.eval.recl import recl, relative_gains, uniform_contexts

CONTEXTS = (100, 200, 300, 400, 500)


def group(hard: int = 50, easy: int = 50) -> dict[str, dict[int, np.ndarray]]:
    """Two models on `hard` tokens (loss 4 at context 100) and `easy` ones (loss 0.5 everywhere, for both).

    On the hard tokens, `long` gains 0.5 nats per 100 tokens of context up to 300 and nothing beyond; `short`
    gains 0.5 up to 200 only. So the group's baseline is 4.0 at 100, 3.5 at 200 (both), 3.0 at 300 (`long`).
    """

    def losses(last_gain: int) -> dict[int, np.ndarray]:
        out = {}
        for c in CONTEXTS:
            hard_loss = 4.0 - 0.5 * (min(c, last_gain) - 100) / 100
            out[c] = np.concatenate([np.full(hard, hard_loss), np.full(easy, 0.5)])
        return out

    return {"long": losses(300), "short": losses(200)}


def test_recl_of_a_group_with_a_known_answer():
    assert recl(group(), r=0.5) == {"long": 300, "short": 200}
    assert recl(group(), r=0.1) == {"long": 300, "short": 200}


def test_relative_gain_is_the_perplexity_reduction_over_the_groups_baseline_on_the_hardest_tokens():
    gains = relative_gains(group(), r=0.5)  # the 50 hard tokens
    first = dict(((c, c2), g) for c, c2, g in gains["long"])
    assert first[(100, 200)] == pytest.approx(1 - math.exp(-0.5))  # (e^4 - e^3.5) / e^4
    assert first[(300, 400)] == pytest.approx(0.0)
    short = dict(((c, c2), g) for c, c2, g in gains["short"])
    # at 200 the baseline is 3.5 (both models); `short` stays at 3.5 for 300: no gain; `long` reaches 3.0
    assert short[(200, 300)] == pytest.approx(0.0) and first[(200, 300)] == pytest.approx(1 - math.exp(-0.5))
    # at 300 the baseline is `long`'s 3.0: `short` (3.5) counts as the baseline, not as a loss
    assert short[(300, 400)] == pytest.approx(0.0)


def test_r_selects_the_tokens_the_baseline_finds_hardest():
    # on all tokens (r = 1) the easy half dilutes the gain: mean loss 2.25 -> 2.0
    gains = dict(((c, c2), g) for c, c2, g in relative_gains(group(), r=1.0)["long"])
    assert gains[(100, 200)] == pytest.approx(1 - math.exp(-0.25))
    # a model that improves only easy tokens gains nothing on the hard fraction, but does on all tokens
    g = group(hard=10, easy=90)
    g["easy-improver"] = {c: np.concatenate([np.full(10, 4.0), np.full(90, 0.5 - 0.2 * (c > 100))]) for c in CONTEXTS}
    assert recl(g, r=0.1)["easy-improver"] == 100
    assert recl(g, r=1.0)["easy-improver"] == 200


def test_threshold_and_a_gain_up_to_the_longest_context():
    g = group()
    assert recl(g, r=0.5, threshold=0.5) == {"long": 100, "short": 100}  # a gain of 0.39 is not enough
    steady = {c: np.full(10, 5.0 - c / 100) for c in CONTEXTS}
    assert recl({"steady": steady}, r=1.0) == {"steady": 500}  # a lower bound: the grid ends at 500


def test_a_worse_model_never_gains_from_losses_above_the_baseline():
    g = group()
    g["bad"] = {c: np.full(100, 9.0) for c in CONTEXTS}
    assert recl(g, r=0.5)["bad"] == 100
    assert all(gain == pytest.approx(0.0) for _, _, gain in relative_gains(g, r=0.5)["bad"])


def test_the_inputs_are_checked():
    g = group()
    with pytest.raises(ValueError, match="contexts"):  # a model's contexts start at the group's shortest
        recl({**g, "odd": {200: np.ones(100), 300: np.ones(100)}}, r=0.1)
    with pytest.raises(ValueError, match="number of tokens"):
        recl({**g, "odd": {c: np.ones(7) for c in CONTEXTS}}, r=0.1)
    with pytest.raises(ValueError, match="r is a fraction"):
        recl(g, r=0.0)


# --- the paper's appendix C: a uniform grid, capped models, exact contexts -----------------------------------------
def test_a_grid_that_does_not_step_uniformly_is_refused():
    """A doubling grid makes every step bigger, so a gain passes the threshold where a uniform Delta would stop."""
    doubling = {c: np.full(10, 5.0 - math.log2(c)) for c in (64, 128, 256, 512)}
    with pytest.raises(ValueError, match="uniformly"):
        recl({"doubling": doubling}, r=0.5)
    assert uniform_contexts(64, 512) == [64, 128, 192, 256, 320, 384, 448, 512]
    assert uniform_contexts(100, 450, shortest=50) == [50, 150, 250, 350, 450]
    with pytest.raises(ValueError, match="two contexts"):
        uniform_contexts(64, 100)


def test_a_model_scored_only_up_to_its_training_length_is_capped_and_leaves_the_baseline_there():
    """The paper scores the vanilla Transformer only up to its training length: its RECL cannot pass it, and beyond
    it the baseline is the best of the others."""
    g = group()  # long: gains to 300; short: gains to 200; baseline 4.0 / 3.5 / 3.0 on the hard tokens
    # a capped model better than both at 100 and 200 (it sets the baseline there), scored no further
    g["capped"] = {c: np.concatenate([np.full(50, 3.9 - 0.5 * (c - 100) / 100), np.full(50, 0.5)]) for c in (100, 200)}
    assert recl(g, r=0.5) == {"long": 300, "short": 200, "capped": 200}
    gains = relative_gains(g, r=0.5)
    assert [(c, c2) for c, c2, _ in gains["capped"]] == [(100, 200)]
    long = {(c, c2): gain for c, c2, gain in gains["long"]}
    # at 200 the capped model's 3.4 is the baseline; `long` reaches 3.0 at 300: gain 1 - e^-0.4
    assert long[(200, 300)] == pytest.approx(1 - math.exp(-0.4))
    # at 300 the baseline is the best of the models scored there (long's 3.0), not the capped model's
    assert long[(300, 400)] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="grid"):
        recl({**g, "gap": {100: np.ones(100), 300: np.ones(100)}}, r=0.5)


def test_every_token_is_scored_with_exactly_c_tokens_of_context():
    """evaluate_windows predicts ids[p] from ids[p - c : p] and nothing else: the loss equals the model's on that
    window alone, and tokens before the window change nothing, even for models that carry a memory or a state. A
    segmented reading (the ablation's: context between c - T and c - 1, a memory reaching further) differs."""
    import torch

    from attnkit.config import RNNLMConfig, TransformerXLConfig
    from attnkit.eval.lm import evaluate_segments, evaluate_windows
    from attnkit.models import build_model

    torch.manual_seed(0)
    xl = build_model("transformer-xl", TransformerXLConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                                           dropout=0.0)).double().eval()
    lstm = build_model("lstm-lm", RNNLMConfig(vocab_size=11, d_model=16, n_layers=1, dropout=0.0)).double().eval()
    ids = torch.randint(11, (80,), generator=torch.Generator().manual_seed(3))
    positions, c = [20, 33, 47, 79], 12
    for model in (xl, lstm):
        ours = evaluate_windows(model, ids, positions, context=c, batch_size=3)
        for p, loss in zip(positions, ours.tolist()):
            alone = -model(ids[None, p - c : p])[0][0, -1].log_softmax(-1)[ids[p]].item()
            assert loss == pytest.approx(alone, rel=1e-6)  # kept in float32
        changed = ids.clone()
        changed[: 20 - c] = (changed[: 20 - c] + 1) % 11  # every token before the first window
        torch.testing.assert_close(evaluate_windows(model, changed, positions, context=c), ours)
    # read in segments of 5 with a memory of the whole window: Transformer-XL's own reading, the same losses
    torch.testing.assert_close(evaluate_windows(xl, ids, positions, context=c, segment=5),
                               evaluate_windows(xl, ids, positions, context=c))
    # the segmented reading: token p of a segment sees between c - T and c - 1 tokens (and the memory's reach)
    streamed = evaluate_segments(xl, ids, tgt_len=4, mem_len=c - 4, keep_tokens=True).token_nll[0]  # token j at j-1
    assert not torch.allclose(streamed[[p - 1 for p in positions]], evaluate_windows(xl, ids, positions, context=c))


def test_recl_of_a_checkpoint_given_as_it_is(tmp_path, family_checkpoints, capsys):
    """A group member LABEL=PATH (an imported Transformer-XL, say) is scored as it is, never trained; a group of one
    measures how far more context still gains it. Text in another vocabulary is refused in one line."""
    import json

    from attnkit.cli.main import main

    ckpt = family_checkpoints["transformer-xl"]
    data = ckpt.parents[2] / "lmdata"  # the text it was trained on, in its vocabulary
    argv = ["experiment", "recl", "--data", data, "--out", tmp_path / "recl", "--group", "alone", f"mine={ckpt}",
            "--delta", "4", "--longest", "12", "--tokens", "6", "--device", "cpu", "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "recl" / "recl.json").read_text())
    assert summary["groups"] == {"alone": ["mine"]} and summary["updates"] is None
    assert summary["models"]["mine"]["checkpoint"] == str(ckpt) and summary["models"]["mine"]["updates"] == ""
    found = summary["results"]["alone"]
    assert list(found) == ["r=0.1", "r=0.5", "r=1"] and all(v["recl"]["mine"] in (4, 8, 12) for v in found.values())
    assert not (tmp_path / "recl" / "lm-char-small-xl").exists()  # nothing trained
    assert sorted(p.name.split("-C")[1].split("-")[0] for p in (tmp_path / "recl" / "mine" / "eval").iterdir()) == \
        ["12", "4", "8"]
    other = ckpt.parents[2] / "words"
    (tmp_path / "w.txt").write_text("a b c d e f g h i j k l m n o p\n" * 20)
    from attnkit.data.lm import prepare_lm

    prepare_lm(other, tmp_path / "w.txt", level="word", valid_fraction=0.2)
    assert main([*map(str, argv[:2]), "--data", str(other), *map(str, argv[4:])]) == 2
    assert "prepare the text with `attnkit lm prepare --vocab-from" in capsys.readouterr().err
