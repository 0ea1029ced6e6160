"""The one-pass cross-entropy a row (`attnkit.nn.cross_entropy`) against torch's own, in float64 (the oracle)."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import cross_entropy
from attnkit.nn.cross_entropy import cross_entropy_rows

N, V = 13, 11


def case(dtype: torch.dtype):
    torch.manual_seed(0)
    logits = (torch.randn(N, V, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    return logits, torch.randint(V, (N,)), torch.rand(N, dtype=torch.float64)  # upstream gradients, row by row


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1 << 20, 4 * V], ids=["one-chunk", "chunks-of-4-rows"])
def test_rows_equal_torch_cross_entropy_in_value_and_gradient(dtype, epsilon, chunk, monkeypatch):
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", chunk)  # 13 rows: chunks of 4, 4, 4 and 1
    logits, target, upstream = case(dtype)
    reference = logits.detach().double().requires_grad_()
    loss, nll = cross_entropy_rows(logits, target, epsilon)
    ref_loss = F.cross_entropy(reference, target, reduction="none", label_smoothing=epsilon)
    ref_nll = F.cross_entropy(reference.detach(), target, reduction="none")
    assert loss.dtype == nll.dtype == torch.promote_types(dtype, torch.float32) and not nll.requires_grad
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss.double(), ref_loss.detach(), **tol)
    torch.testing.assert_close(nll.double(), ref_nll, **tol)
    (loss * upstream.to(loss.dtype)).sum().backward()  # every row scaled by its own upstream gradient
    (ref_loss * upstream).sum().backward()
    assert logits.grad.dtype == dtype
    grad_tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 4e-3}[dtype]
    torch.testing.assert_close(logits.grad.double(), reference.grad, atol=grad_tol, rtol=grad_tol)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_rows_pass_gradcheck(epsilon):
    logits, target, _ = case(torch.float64)
    assert torch.autograd.gradcheck(lambda z: cross_entropy_rows(z, target, epsilon)[0], (logits,))


def test_no_rows_and_no_gradient_to_make():
    empty = torch.zeros(0, V, requires_grad=True)
    loss, _ = cross_entropy_rows(empty, torch.zeros(0, dtype=torch.long))
    loss.sum().backward()
    assert loss.shape == (0,) and empty.grad.shape == (0, V)
    logits, target, _ = case(torch.float32)
    with torch.no_grad():  # evaluation: the loss only, nothing kept for a backward
        loss, nll = cross_entropy_rows(logits, target)
    assert not loss.requires_grad and torch.equal(loss, nll)


# --- the loss from the output layer's input: the logits made a chunk at a time (`projected_cross_entropy`) -----------
B, T, D = 3, 7, 5  # 21 rows, 5 of them padding (target 0)


def projected_case(bias: bool):
    torch.manual_seed(1)
    h = torch.randn(B, T, D, dtype=torch.float64)
    weight = torch.randn(V, D, dtype=torch.float64)
    target = torch.randint(1, V, (B, T))
    target[0, 4:], target[2, 5:] = 0, 0  # padding
    return [h, weight, torch.randn(V, dtype=torch.float64) if bias else None], target


def through_logits(h, weight, bias, target, epsilon):
    """The oracle: the whole (N, V) logits, torch's cross-entropy, padding ignored, summed."""
    logits = F.linear(h, weight, bias).reshape(-1, V)
    loss = F.cross_entropy(logits, target.reshape(-1), ignore_index=0, reduction="sum", label_smoothing=epsilon)
    return loss, F.cross_entropy(logits.detach(), target.reshape(-1), ignore_index=0, reduction="sum")


def losses_and_grads(fn, tensors, target, epsilon, dtype, autocast=False):
    leaves = [None if t is None else t.detach().to(dtype).requires_grad_() for t in tensors]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, nll = fn(*leaves, target, epsilon)
    (loss * 0.37).backward()  # the trainer's scale (world / tokens), one number
    return [loss.detach().double(), nll.double()] + [t.grad.double() for t in leaves if t is not None]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("multiple", [0, 3], ids=["rows-as-they-come", "stable-rows-3"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_projected_loss_equals_the_loss_of_the_whole_logits(bias, epsilon, multiple, dtype, monkeypatch):
    from attnkit.train.losses import projected_label_smoothed_nll

    monkeypatch.setattr(cross_entropy, "PROJECTED_CHUNK_ELEMENTS", 8 * V)  # 16 real rows: chunks of 8, or of 3 (+ 1)
    tensors, target = projected_case(bias)
    reference = losses_and_grads(through_logits, tensors, target, epsilon, torch.float64)

    def fn(*args):
        return projected_label_smoothed_nll(*args, ignore_index=0, row_multiple=multiple)

    fused = losses_and_grads(fn, tensors, target, epsilon, dtype)
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, want, **tol)


def test_projected_loss_in_bf16_autocast_is_as_close_to_float64_as_the_whole_logits_are(monkeypatch):
    from attnkit.train.losses import label_smoothed_nll, projected_label_smoothed_nll

    monkeypatch.setattr(cross_entropy, "PROJECTED_CHUNK_ELEMENTS", 16 * V)
    tensors, target = projected_case(bias=True)
    exact = losses_and_grads(through_logits, tensors, target, 0.1, torch.float64)

    def whole(h, weight, bias, target, epsilon):  # the trainer's path before: bf16 logits, then the rows' loss
        return label_smoothed_nll(F.linear(h, weight, bias), target, epsilon)

    plain = losses_and_grads(whole, tensors, target, 0.1, torch.float32, autocast=True)
    fused = losses_and_grads(projected_label_smoothed_nll, tensors, target, 0.1, torch.float32, autocast=True)
    for got, old, want in zip(fused, plain, exact, strict=True):
        err, old_err = (got - want).abs().max().item(), (old - want).abs().max().item()
        assert err <= 2 * old_err + 1e-6 * want.abs().max().item(), (err, old_err)
        assert err <= 0.02 * want.abs().max().item()


def test_projected_loss_passes_gradcheck():
    from attnkit.nn.cross_entropy import projected_cross_entropy

    tensors, target = projected_case(bias=True)
    h, weight, bias = (t.detach().reshape(-1, t.size(-1)) if t.dim() > 1 else t.detach() for t in tensors)
    rows = target.reshape(-1).ne(0)
    leaves = [h[rows][:6].requires_grad_(), weight.requires_grad_(), bias.requires_grad_()]
    assert torch.autograd.gradcheck(lambda *x: projected_cross_entropy(*x, target.reshape(-1)[rows][:6], 0.1)[0],
                                    leaves)


def test_projected_loss_never_makes_the_whole_logits_nor_those_of_padding(monkeypatch):
    from attnkit.train.losses import projected_label_smoothed_nll
    from conftest import linear_rows

    monkeypatch.setattr(cross_entropy, "PROJECTED_CHUNK_ELEMENTS", 16 * V)
    tensors, target = projected_case(bias=False)
    real = int(target.ne(0).sum())  # 16 of 21
    rows = linear_rows(monkeypatch)
    loss, _ = projected_label_smoothed_nll(*[t.requires_grad_() for t in tensors[:2]], None, target, 0.1)
    assert rows == [real] and cross_entropy.projection_rows(V) == 16  # one chunk, the real rows only
    rows.clear()
    # a row multiple caps the chunk, and every chunk runs on as many rows (the last padded)
    projected_label_smoothed_nll(*tensors[:2], None, target, 0.1, row_multiple=5)
    assert rows == [5] * 4 and cross_entropy.projection_rows(V, row_multiple=5) == 5
    rows.clear()
    with torch.no_grad():  # evaluation: the loss alone, no gradient made
        loss_eval, _ = projected_label_smoothed_nll(*tensors[:2], None, target, 0.1)
    assert not loss_eval.requires_grad and torch.equal(loss_eval, loss.detach())
