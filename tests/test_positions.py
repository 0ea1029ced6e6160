"""`model.positions`: sinusoidal, learned (a trained row per position) and none (order-blind), in the encoder-decoder
and the vanilla LMs; each does what it names and nothing else."""

from __future__ import annotations

import pytest
import torch

from attnkit.config import TransformerXLConfig
from attnkit.errors import ConfigError
from attnkit.models import Transformer, build_model
from attnkit.nn import LearnedPositions, sinusoid_table
from conftest import tiny_model_config

pytestmark = pytest.mark.usefixtures("one_thread")


def seq2seq(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(**kw)).double().eval()


def lm(kind: str, **kw):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(kind=kind, vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, **kw)
    return build_model(kind, cfg).double().eval()


def ids(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 40, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "none", "shaw"])
def test_the_embedding_adds_what_the_positions_name(kind):
    """Scaled tokens plus the sinusoid's rows, the learned table's rows, or nothing (shaw's are in the attention),
    from the offset on."""
    m = seq2seq(positions=kind, max_positions=12)
    x = ids(2, 5)
    expected = {"sinusoidal": sinusoid_table(12, 16)[3:8].double(), "learned": m.positions.table[3:8],
                "none": torch.zeros(5, 16, dtype=torch.double), "shaw": torch.zeros(5, 16, dtype=torch.double)}[kind]
    torch.testing.assert_close(m.embed(m.src_embed, x, offset=3), m.src_embed(x) * 4.0 + expected)  # sqrt(16) = 4


def test_learned_positions_are_trained_and_saved_and_only_the_rows_used_get_gradients():
    m = seq2seq(positions="learned", max_positions=12)
    assert isinstance(m.positions, LearnedPositions) and "positions.table" in m.state_dict()
    assert "positions.table" not in seq2seq().state_dict()  # the sinusoids are computed, not stored
    m(ids(2, 4), ids(2, 6, 1)).sum().backward()  # source positions 0..3, target 0..5
    used = m.positions.table.grad.abs().sum(-1) > 0  # (P,)
    assert used.tolist() == [True] * 6 + [False] * 6


@pytest.mark.parametrize("kind", ["learned", "none", "shaw"])
def test_cached_decoding_reads_each_step_at_its_own_position(kind):
    """The step at position t adds row t (the cache's offset), as the teacher-forced pass does."""
    m = seq2seq(positions=kind)
    src, tgt = ids(2, 7), ids(2, 6, 1)
    full = m(src, tgt).log_softmax(-1)  # (B, T, V)
    state = m.init_state(m.encode(src))
    for t in range(tgt.size(1)):
        logp, state, _ = m.step(tgt[:, t], state)
        torch.testing.assert_close(logp, full[:, t].to(logp.dtype))  # the step returns float32


def test_a_position_past_the_learned_table_is_a_one_line_error():
    m = seq2seq(positions="learned", max_positions=6)
    m(ids(1, 6), ids(1, 6, 1))  # the last row is usable
    with pytest.raises(ConfigError, match="learned positions hold 6 rows.*position 6 was asked for"):
        m(ids(1, 7), ids(1, 3, 1))
    vanilla = lm("vanilla-lm", positions="learned", max_positions=6)
    with pytest.raises(ConfigError, match="model.max_positions"):
        vanilla(ids(1, 7))


def test_without_positions_the_encoder_is_permutation_equivariant_and_with_them_it_is_not():
    """The order-blindness argument: shuffle the source, and an encoder without positions shuffles its states the
    same way (self-attention is a function of the set of tokens); the decoder's outputs, which read the source as a
    set of keys and values, do not change at all. Any absolute positions break both."""
    src, tgt = ids(2, 9), ids(2, 5, 1)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))
    for kind, blind in (("none", True), ("sinusoidal", False), ("learned", False), ("shaw", False)):
        m = seq2seq(positions=kind)
        memory, shuffled = m.encode(src).memory, m.encode(src[:, perm]).memory  # (B, S, D)
        assert torch.allclose(shuffled, memory[:, perm]) is blind, kind
        assert torch.allclose(m(src[:, perm], tgt), m(src, tgt)) is blind, kind


@pytest.mark.parametrize("kind", ["vanilla-lm", "recurrent-vanilla-lm"])
def test_the_vanilla_lms_add_the_learned_rows(kind):
    m = lm(kind, positions="learned", max_positions=10)
    added = []
    m.positions.register_forward_hook(lambda mod, args, out: added.append(out - args[0]))
    m(ids(2, 6))
    torch.testing.assert_close(added[0][0], m.positions.table[:6])


def test_transformer_xl_refuses_absolute_positions_and_unknown_kinds_are_named():
    with pytest.raises(ConfigError, match="Transformer-XL's relative positions are sinusoids"):
        TransformerXLConfig(kind="transformer-xl", positions="learned")
    with pytest.raises(ConfigError, match="model.positions must be one of sinusoidal, learned, none, shaw, not 'rope'"):
        tiny_model_config(positions="rope")
