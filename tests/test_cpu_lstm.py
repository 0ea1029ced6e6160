"""LayerwiseLSTM (attnkit/cpu/lstm.py) against nn.LSTM, the oracle: the same outputs, final states and gradients on
the same Parameters, shared and not copied, and attnkit's dropout between the layers (never before the first or after
the last) at rate p with the kept values scaled by 1 / (1 - p)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.config import RNNLMConfig
from attnkit.cpu.dropout import dropout
from attnkit.cpu.lstm import LayerwiseLSTM
from attnkit.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
D = 16


def lstm(layers: int = 3, p: float = 0.0, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.LSTM:
    torch.manual_seed(seed)
    return nn.LSTM(D, D, layers, dropout=p if layers > 1 else 0.0).to(dtype)  # time-major, as attnkit's LSTM LM


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 1, grad: bool = False) -> torch.Tensor:
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return x.requires_grad_(grad)


def test_in_eval_mode_outputs_and_final_states_equal_nn_lstms():
    """With dropout set (eval mode drops nothing), from zeros and from a carried state."""
    ref = lstm(p=0.3).eval()
    ours = LayerwiseLSTM.sharing(ref)
    assert not ours.training
    x = randn(7, 4, D)  # (T, B, D)
    state = (randn(3, 4, D, seed=2), randn(3, 4, D, seed=3))  # (L, B, D) x 2
    for start in (None, state):
        out, (h_n, c_n) = ours(x, start)
        ref_out, (ref_h, ref_c) = ref(x, start)
        assert out.shape == ref_out.shape == (7, 4, D) and h_n.shape == c_n.shape == (3, 4, D)
        for a, b in ((out, ref_out), (h_n, ref_h), (c_n, ref_c)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_gradients_equal_nn_lstms_without_dropout():
    """Training mode, dropout 0: every gradient (input, initial state, each layer's weights) as nn.LSTM's."""
    ref = lstm(dtype=torch.float64).train()
    ours = LayerwiseLSTM.sharing(ref)
    x = randn(7, 3, D, dtype=torch.float64, grad=True)
    state = tuple(randn(3, 3, D, dtype=torch.float64, seed=s, grad=True) for s in (2, 3))
    inputs = [x, *state, *ref.parameters()]

    def loss(out) -> torch.Tensor:  # every output and both final states weigh in, differently
        return out[0].square().sum() + out[1][0].sum() + 2 * out[1][1].sum()

    got = torch.autograd.grad(loss(ours(x, state)), inputs)
    expected = torch.autograd.grad(loss(ref(x, state)), inputs)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_it_shares_nn_lstms_parameters_and_state_dict():
    ref = lstm(p=0.2).train()
    ours = LayerwiseLSTM.sharing(ref)
    assert ours.training and ours.dropout == 0.2 and ours.num_layers == 3
    ours_named, ref_named = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert list(ours_named) == list(ref_named)
    assert all(ours_named[name] is p for name, p in ref_named.items())  # the same objects: nothing copied
    ours_state, ref_state = ours.state_dict(), ref.state_dict()
    assert list(ours_state) == list(ref_state)
    assert all(ours_state[k].data_ptr() == ref_state[k].data_ptr() for k in ref_state)
    with torch.no_grad():  # an update to nn.LSTM's weights (an optimizer's step) is the LayerwiseLSTM's too
        ref.weight_hh_l1.add_(0.5)
    x = randn(5, 2, D)
    torch.testing.assert_close(ours.eval()(x)[0], ref.eval()(x)[0], rtol=0, atol=1e-6)


def test_an_lstm_lm_keeps_its_state_dict_and_its_losses_with_a_layerwise_lstm():
    torch.manual_seed(0)
    model = build_model("lstm-lm", RNNLMConfig(vocab_size=13, d_model=D, n_layers=2, dropout=0.0)).double().eval()
    x = torch.randint(13, (3, 9), generator=torch.Generator().manual_seed(4))  # (B, T)
    before = model.state_dict()
    plain_nll, plain_mems = model(x[:, :-1], targets=x[:, 1:], mem_len=4)
    model.rnn = LayerwiseLSTM.sharing(model.rnn)
    after = model.state_dict()
    assert list(after) == list(before) and all(after[k] is before[k] or torch.equal(after[k], before[k])
                                               for k in before)
    nll, mems = model(x[:, :-1], targets=x[:, 1:], mem_len=4)
    torch.testing.assert_close(nll, plain_nll, rtol=0, atol=1e-12)
    for a, b in zip(mems, plain_mems, strict=True):  # the state carried to the next segment, [h, c]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_dropout_falls_between_the_layers_as_single_layers_with_attnkits_dropout():
    """In training, against single-layer nn.LSTMs on each layer's weights with attnkit's dropout drawn in the same
    order after every layer but the last; the final states are the layers' own."""
    ref = lstm(p=0.3, dtype=torch.float64).train()
    ours = LayerwiseLSTM.sharing(ref)
    singles = []
    for i in range(3):
        single = nn.LSTM(D, D, 1).double()
        single.load_state_dict({f"{name}_l0": getattr(ref, f"{name}_l{i}")
                                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
        singles.append(single)
    x = randn(6, 2, D, dtype=torch.float64)
    torch.manual_seed(7)
    out, (h_n, c_n) = ours(x)
    torch.manual_seed(7)
    expected, finals = x, []
    for i, single in enumerate(singles):
        expected = dropout(expected, 0.3, True) if i else expected
        expected, final = single(expected)
        finals.append(final)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(h_n, torch.cat([f[0] for f in finals]))
    torch.testing.assert_close(c_n, torch.cat([f[1] for f in finals]))
    assert not torch.equal(out, ours.eval()(x)[0])  # the dropout did act


def transparent_second_layer(model: nn.LSTM) -> None:
    """Layer 1 made to pass its input x through as tanh(tanh(x)): input, forget and output gates saturated (1, 0, 1;
    sigmoid(+-40) rounds to 1 and ~4e-18 in float64), the candidate tanh(x) (identity weights), no recurrence."""
    with torch.no_grad():
        model.weight_ih_l1.zero_()
        model.weight_ih_l1[2 * D : 3 * D] = torch.eye(D)  # gates in torch's order: input, forget, cell, output
        model.weight_hh_l1.zero_()
        model.bias_hh_l1.zero_()
        model.bias_ih_l1.copy_(torch.cat([torch.full((D,), 40.0), torch.full((D,), -40.0), torch.zeros(D),
                                          torch.full((D,), 40.0)]))


def test_dropout_between_the_layers_drops_at_rate_p_and_scales_the_rest():
    """The second layer's input read back from its output (atanh twice): zero where dropped, at rate p, and the
    first layer's output / (1 - p) elsewhere; not on the network's input, not on its output."""
    p = 0.3
    ref = lstm(layers=2, p=p, dtype=torch.float64)
    transparent_second_layer(ref)
    first = nn.LSTM(D, D, 1).double()
    first.load_state_dict({f"{n}_l0": getattr(ref, f"{n}_l0") for n in ("weight_ih", "weight_hh", "bias_ih",
                                                                         "bias_hh")})
    ours = LayerwiseLSTM.sharing(ref).train()
    x = randn(40, 50, D, dtype=torch.float64)  # (T, B, D): 32,000 values between the layers
    torch.manual_seed(0)
    with torch.no_grad():
        out, _ = ours(x)
        between = out.atanh().atanh()  # the second layer's input
        h1 = first(x)[0]  # the first layer's output, from the undropped input
    dropped = between.abs() < 1e-12
    rate = dropped.double().mean().item()
    assert abs(rate - p) < 0.015, f"dropped {rate:.4f} of the values between the layers, not ~{p}"
    torch.testing.assert_close(between, torch.where(dropped, 0.0, h1 / (1 - p)), rtol=0, atol=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x)[0].atanh().atanh(), h1, rtol=0, atol=1e-9)  # eval: none dropped


@pytest.mark.parametrize("kw", [dict(bidirectional=True), dict(batch_first=True), dict(proj_size=4)])
def test_other_lstms_are_refused(kw):
    with pytest.raises(ValueError, match="unidirectional, time-major LSTM without projection"):
        LayerwiseLSTM.sharing(nn.LSTM(D, D, 2, **kw))


def test_an_input_of_the_wrong_rank_is_refused():
    with pytest.raises(ValueError, match=r"input must be a \(T, B, I\) tensor, not a 2-d tensor"):
        LayerwiseLSTM(D, D, 2)(torch.randn(5, D))
