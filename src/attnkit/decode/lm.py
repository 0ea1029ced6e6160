"""Sampling from a language model (Transformer-XL or the vanilla LM), one token at a time.

B batch, P prompt length, V vocabulary, W the vanilla LM's attention window.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnkit.decode.search import filter_logits
from attnkit.models.transformer_xl import LanguageModel
from attnkit.nn import prepacked


@torch.no_grad()
@prepacked()
def generate(model: LanguageModel, prompt: torch.Tensor, n_new: int, *, mem_len: int, clamp_len: int = 0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None,
             on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Sample n_new tokens after prompt (B, P) -> (B, n_new); `on_token` sees each step's tokens (B, 1) as they
    are drawn (a service streams them; an exception it raises stops the sampling).

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
        if on_token is not None:
            on_token(token)
        if len(out) == n_new:
            break
        if xl:
            logits, mems = model(token, mems, mem_len=mem_len, clamp_len=clamp_len)
        else:
            context = torch.cat([context, token], dim=1)[:, -mem_len:]  # (B, <= W)
            logits, _ = model(context)
    return torch.cat(out, dim=1)


def prompt_ids(vocab, prompt: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """A prompt as the LM reads it, (1, P): its ids without the end-of-line token the vocabulary appends (an empty
    prompt is that one token: the start of a line)."""
    ids = vocab.encode([prompt])
    return torch.as_tensor(ids[:-1] if len(ids) > 1 else ids, dtype=torch.long, device=device)[None]


def sampling_window(model: LanguageModel, cfg, mem_len: int | None) -> int:
    """The memory (Transformer-XL) or window of recent tokens (the others) to sample with: `mem_len`, else the run's
    evaluation memory, else its training segment."""
    window = cfg.train.eval_lengths[1] if mem_len is None else mem_len
    if model.kind != "transformer-xl" and window <= 0:
        window = cfg.train.tgt_len
    return window


def sample_text(model: LanguageModel, vocab, cfg, prompt: str, length: int, *, mem_len: int | None = None,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                on_text: Callable[[str], None] | None = None) -> str:
    """`length` tokens sampled after `prompt` with a generator seeded by `seed` (`attnkit lm generate` and the
    service's POST /generate): the continuation's text. `on_text` gets the text each token adds as it is drawn."""
    device = next(model.parameters()).device
    ids: list[int] = []
    shown = ""

    def emit(token: torch.Tensor) -> None:  # token (1, 1)
        nonlocal shown
        ids.append(int(token[0, 0]))
        text = vocab.decode(ids)
        delta, shown = (text[len(shown):], text) if text.startswith(shown) else (text, text)
        on_text(delta)

    generator = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, prompt_ids(vocab, prompt, device), length, mem_len=sampling_window(model, cfg, mem_len),
                   clamp_len=cfg.train.clamp_len, temperature=temperature, top_k=top_k, top_p=top_p,
                   generator=generator, on_token=emit if on_text is not None else None)
    return vocab.decode(out[0].tolist())
