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
