"""Attention functions for CPUs (`attnkit.nn.attention`'s interface): the same softmax(QK^T * scale) V as
`sdpa_attention`, through the kernels that are quicker at the shapes translation and its training bring.

B batch, H heads, T queries, S keys, Dh head dim, D = H * Dh.

- Few (query, key) pairs per head (`_short`): the written-out products (`eager_attention`). SDPA's CPU kernel works
  in blocks of queries and keys, with a fixed cost per (batch, head) that small blocks do not repay: up to 4096
  pairs per head (beam search's cross-attention, the MT workload's self-attention) the explicit products win, from
  about 128 x 128 SDPA does.
- Training with dropout on the weights: the written-out products too, whose dropout is the module's (on CPUs
  attnkit.cpu.dropout's masks, `training_scope` swaps them in), where SDPA's math path draws `bernoulli_`.
- One query (a decoding step): two batched products over all B * H heads at once (`_one_query`). SDPA takes each
  (batch, head) apart with two small products of its own, a fixed cost per head that one query does not repay.
- Anything else: SDPA.

`cpu_training_attention` adds the float32 products of attnkit.cpu.float32_attention for half-precision training where
oneDNN's kernel builds are costly. `attnkit bench --workloads mt-train mt-greedy mt-beam5` times them;
tests/test_attention.py checks every path against the plain ones.
"""

from __future__ import annotations

import torch

from attnkit.cpu.float32_attention import attend_float32
from attnkit.nn.attention import MultiHeadAttention, eager_attention, sdpa_attention
from attnkit.nn.masks import causal_mask


def _short(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the explicit path beats CPU SDPA: several queries, few (query, key) pairs per head."""
    return q.size(2) > 1 and q.size(2) * k.size(2) <= 4096


def _one_query(module: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
    """(B, H, 1, Dh) queries over (B, H, S, Dh) keys -> (B, 1, D), the keys read transposed in place."""
    b, h, _, dh = q.shape
    scores = torch.bmm(q.reshape(b * h, 1, dh), k.flatten(0, 1).transpose(1, 2)).mul_(module.score_scale)  # (B*H,1,S)
    if mask is not None:  # (B or 1, 1, 1, S)
        scores.view(b, h, 1, -1).masked_fill_(~mask, float("-inf"))
    weights = (scores.float() if scores.element_size() < 4 else scores).softmax(dim=-1).to(v.dtype)
    out = torch.bmm(weights, v.flatten(0, 1))  # (B*H, 1, Dh)
    return out.view(b, 1, h * dh)


def cpu_attention(module: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  mask: torch.Tensor | None, causal: bool, need_weights: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention function for CPUs (module docstring): ((B, T, D), weights (B, H, T, S) or None)."""
    if q.device.type != "cpu" or need_weights:
        return sdpa_attention(module, q, k, v, mask=mask, causal=causal, need_weights=need_weights)
    dropout = module.attention_dropout.p if module.training else 0.0
    if dropout > 0 or _short(q, k):
        return eager_attention(module, q, k, v, mask=mask, causal=causal, need_weights=False)
    if causal and (mask is not None or q.size(2) != k.size(2)):  # as sdpa_attention spells it out
        keep = causal_mask(q.size(2), k.size(2), q.device)
        mask, causal = (keep if mask is None else mask & keep), False
    if q.size(2) == 1 and not causal:
        return _one_query(module, q, k, v, mask), None
    return sdpa_attention(module, q, k, v, mask=mask, causal=causal, need_weights=False)


def cpu_training_attention(module: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                           mask: torch.Tensor | None, causal: bool, need_weights: bool
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`cpu_attention`, with half-precision products in float32 where it would write them out in training (no
    kernel to build for each new length: attnkit.cpu.float32_attention)."""
    half = q.element_size() < 4 and q.is_floating_point()
    dropout = module.attention_dropout.p if module.training else 0.0
    if (half and module.training and not need_weights and q.device.type == "cpu"
            and (dropout > 0 or _short(q, k))):
        out = attend_float32(q, k, v, mask=mask, causal=causal, scale=module.score_scale, dropout=dropout)
        return module.merge_heads(out), None
    return cpu_attention(module, q, k, v, mask=mask, causal=causal, need_weights=need_weights)
