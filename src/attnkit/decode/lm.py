"""Sampling from a language model (Transformer-XL or the vanilla LM), one token at a time.

B batch, P prompt length, V vocabulary, W the vanilla LM's attention window.
"""

from __future__ import annotations

import torch

from attnkit.decode.search import filter_logits
from attnkit.models.transformer_xl import LanguageModel
from attnkit.nn import prepacked


@torch.no_grad()
@prepacked()
def generate(model: LanguageModel, prompt: torch.Tensor, n_new: int, *, mem_len: int, clamp_len: int = 0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample n_new tokens after prompt (B, P) -> (B, n_new).

    Transformer-XL reads the prompt once, then feeds one token per step with its memory of mem_len
    (each new token costs one step, not a recomputation; the context is the memory). The vanilla LM
    has no memory: every step recomputes its last mem_len tokens (its attention window).
    """
    model.eval()
    xl = model.kind == "transformer-xl"
    logits, mems = model(prompt[:, -mem_len:] if not xl else prompt, None, mem_len=mem_len, clamp_len=clamp_len)
    context, out = prompt, []
    for _ in range(n_new):
        probs = filter_logits(logits[:, -1].float() / max(temperature, 1e-6), top_k, top_p).softmax(-1)  # (B, V)
        token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        out.append(token)
        if xl:
            logits, mems = model(token, mems, mem_len=mem_len, clamp_len=clamp_len)
        else:
            context = torch.cat([context, token], dim=1)[:, -mem_len:]  # (B, <= W)
            logits, _ = model(context)
    return torch.cat(out, dim=1)
