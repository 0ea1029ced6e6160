"""A decoding step's log-probabilities over the vocabulary.

N rows, V vocabulary.
"""

from __future__ import annotations

import torch


def step_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Fresh logits (N, V), read by nothing else, -> float32 log-probabilities (N, V).

    In inference, contiguous float32 logits are normalised in place (`_log_softmax` with the input as its
    `out`; each row is read in full before it is written, and the result equals `log_softmax`'s bit for bit,
    which tests/test_decode.py checks): a decoding step then does not allocate and fill a second (N, V)
    tensor, and the memory cache keeps one (`attnkit bench --workloads mt-greedy`). Other dtypes are
    normalised in float32 into a new tensor, and with gradients recorded nothing is overwritten.
    """
    recorded = torch.is_grad_enabled() and logits.requires_grad
    if logits.dtype == torch.float32 and logits.is_contiguous() and not recorded:
        return torch._log_softmax(logits, -1, False, out=logits)
    return logits.float().log_softmax(dim=-1)
