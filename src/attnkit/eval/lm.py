"""Language-model evaluation: loss, perplexity, bits per character, tokens/s.

N tokens, B streams, T segment length, M memory length, W window (vanilla attention length), V vocabulary.

Two ways to score a corpus:
- `evaluate_segments`: ordered segments of T; Transformer-XL carries its memory of M from one segment to
  the next (evaluation may use longer T / M / clamp_len than training did); the vanilla LM sees each
  segment alone (fast, but the first tokens of every segment have little context).
- `evaluate_sliding_window`: Al-Rfou et al.'s evaluation of the vanilla LM: every token is predicted
  from the W tokens before it, one prediction per window, everything recomputed — the cost the
  Transformer-XL paper compares against (section 4.1, table 9) and `attnkit lm speed` measures.

Both ask the model for per-token NLLs (`model(x, mems, targets=y)`), which an adaptive softmax computes
without building the (B, T, V) distribution. `evaluate_segments(..., keep_tokens=True)` also returns them, one
row per stream in corpus order (what the relative effective context length, attnkit.eval.recl, compares).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from attnkit.data.lm import LMStreams
from attnkit.nn import prepacked
from attnkit.runtime import autocast


@dataclass
class LMScores:
    nll: float  # summed negative log-likelihood (nats)
    tokens: int  # predicted tokens
    seconds: float
    # with keep_tokens: (B, N) float32 NLL of every predicted token, row b = stream b, column j = its (j+1)-th token
    token_nll: torch.Tensor | None = field(default=None, repr=False)

    @property
    def loss(self) -> float:
        """Mean nats per token."""
        return self.nll / max(1, self.tokens)

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 50.0))

    @property
    def bpc(self) -> float:
        """Bits per token: bits per character on a character-level corpus."""
        return self.loss / math.log(2)

    @property
    def tok_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def as_dict(self) -> dict[str, float]:
        return {"loss": self.loss, "ppl": self.ppl, "bpc": self.bpc, "tokens": self.tokens, "tok_s": self.tok_s}

    def summary(self) -> str:
        return (f"loss {self.loss:.4f} nats | ppl {self.ppl:.2f} | bpc {self.bpc:.4f} | "
                f"{self.tokens:,} tokens | {self.tok_s:,.0f} tok/s")


def scored_segments(model, ids: torch.Tensor, *, tgt_len: int, mem_len: int = 0, clamp_len: int = 0,
                    ext_len: int = 0, batch_size: int = 1, device: torch.device | str = "cpu",
                    dtype: str = "float32") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(token NLL (B, T), targets (B, T)) of each segment of ids (N,) read as B ordered streams, in order, the
    memory carried from one segment to the next (call it under no_grad, the model in eval mode)."""
    device, mems = torch.device(device), None
    for x, y in LMStreams(ids, batch_size, tgt_len, ext_len):
        with autocast(device, dtype):
            token, mems = model(x.to(device), mems, targets=y.to(device), mem_len=mem_len, clamp_len=clamp_len,
                                ext_len=ext_len)
        yield token, y


@torch.no_grad()
@prepacked()
def evaluate_segments(model, ids: torch.Tensor, *, tgt_len: int, mem_len: int = 0, clamp_len: int = 0,
                      ext_len: int = 0, batch_size: int = 1, max_tokens: int = 0, device: torch.device | str = "cpu",
                      dtype: str = "float32", keep_tokens: bool = False) -> LMScores:
    """Score ids (N,) read as B ordered streams in segments of T, carrying the memory (XL) across segments;
    each segment also reads the ext_len tokens before it (extended context, not scored). With mem_len 0 and
    ext_len E, every segment re-reads the E tokens before it as plain context and nothing is carried: the
    attention length of a model without memory is E + T. `keep_tokens`: also every token's NLL (`token_nll`)."""
    model.eval()
    nll, n, kept = 0.0, 0, []
    start = time.perf_counter()
    for token, y in scored_segments(model, ids, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                    ext_len=ext_len, batch_size=batch_size, device=device, dtype=dtype):
        nll, n = nll + token.sum().item(), n + y.numel()  # token: (B, T) NLL
        if keep_tokens:
            kept.append(token.float().cpu())
        if max_tokens and n >= max_tokens:
            break
    return LMScores(nll, n, time.perf_counter() - start, torch.cat(kept, dim=1) if kept else None)


@torch.no_grad()
@prepacked()
def evaluate_sliding_window(model, ids: torch.Tensor, *, window: int, batch_size: int = 16, max_tokens: int = 0,
                            device: torch.device | str = "cpu", dtype: str = "float32") -> LMScores:
    """Score ids[1:] with every token p predicted from ids[max(0, p-W) : p], one prediction per window.

    The first forward pass over ids[:W] scores tokens 1 .. W at once: for a causal model its outputs
    at position p - 1 are exactly those of the shorter window ids[:p]. Every later token gets its own
    full window of W (B windows per forward pass), and only its last position is scored.
    """
    device = torch.device(device)
    model.eval()
    n = ids.numel() if not max_tokens else min(ids.numel(), max_tokens + 1)
    start, nll = time.perf_counter(), 0.0
    head = ids[: min(window, n - 1)].to(device)[None]  # (1, W)
    with autocast(device, dtype):
        nll += model(head, targets=ids[1 : head.size(1) + 1].to(device)[None])[0].sum().item()  # (1, W) NLL
    if n - 1 <= window:
        return LMScores(nll, n - 1, time.perf_counter() - start)
    windows = ids[: n - 1].unfold(0, window, 1)  # (N - W, W): row r = ids[r : r + W], predicting ids[r + W]
    targets = ids[1:n].unfold(0, window, 1)  # (N - W, W): row r = ids[r + 1 : r + W + 1]
    for first in range(1, windows.size(0), batch_size):
        x, y = windows[first : first + batch_size].to(device), targets[first : first + batch_size].to(device)
        with autocast(device, dtype):
            nll += model(x, targets=y)[0][:, -1].sum().item()  # (B, W) NLL, scored at the last position only
    return LMScores(nll, n - 1, time.perf_counter() - start)
