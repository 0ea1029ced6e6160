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
row per stream in corpus order.

Two ways to score chosen tokens only:
- `evaluate_windows`: token p predicted from exactly the C tokens before it, ids[p-C : p], the model starting from
  nothing (no memory or state from before the window): every token's context is C, what the relative effective
  context length (attnkit.eval.recl) compares. In a segmented reading a token's context depends on its place in
  the segment, and a carried memory reaches further than the memory itself.
- `window_log_probs`, `stream_log_probs`: the whole distribution at chosen positions, from exactly the C tokens
  before each (as `evaluate_windows`), or of B streams read in segments of T with the memory carried (as
  `evaluate_segments` reads them): what the planted-recall scorer (attnkit.eval.recall) reads. Both can hand each
  batch of distributions to a `reduce` callback with the tokens that stand there and keep only its result (the
  planted-recall scores keep 2 numbers a token, not V).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from attnkit.cpu import for_inference
from attnkit.data.lm import LMStreams
from attnkit.runtime import autocast

Reduce = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (k, V) log-probabilities, (k,) tokens -> (k, F)


def _inference_copy(fn: Callable) -> Callable:
    """`fn(model, ...)` run on `attnkit.cpu.for_inference(model)` (prepacked products, CPU attention)."""

    @functools.wraps(fn)
    def run(model, *args, **kw):
        return fn(for_inference(model), *args, **kw)

    return run


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
@_inference_copy
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
@_inference_copy
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


def _windows(ids: torch.Tensor, positions: Sequence[int], context: int,
             batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs (b, C), targets (b,)) for the positions, b <= batch_size at a time: row k = ids[p_k - C : p_k]."""
    positions = torch.as_tensor(list(positions), dtype=torch.long)
    if positions.numel() and (int(positions.min()) < context or int(positions.max()) >= ids.numel()):
        raise ValueError(f"every position needs {context} tokens before it inside the {ids.numel()} ids, "
                         f"not {int(positions.min())} .. {int(positions.max())}")
    offsets = torch.arange(-context, 0)  # (C,)
    for first in range(0, positions.numel(), batch_size):
        p = positions[first : first + batch_size]
        yield ids[p[:, None] + offsets], ids[p]  # (b, C), (b,)


def _read_window(model, x: torch.Tensor, y: torch.Tensor | None, *, segment: int | None, clamp_len: int):
    """The model's output at the last of the inputs x (b, C), read from nothing: in one pass, or in segments of
    `segment` carrying a memory of all C (the last segment ends at the target): the NLL of y (b, 1), or the
    log-probabilities (b, V) when y is None."""
    c = x.size(1)
    cuts = [c] if not segment or segment >= c else list(range(c % segment or segment, c + 1, segment))
    mems, start = None, 0
    for end in cuts:
        last = end == c
        # before the last segment only the memory matters: score one position, build no (b, T, V)
        targets = y[:, None] if last and y is not None else (None if last else x[:, end - 1 : end].contiguous())
        out, mems = model(x[:, start:end].contiguous(), mems, targets=targets, mem_len=c if segment else 0,
                          clamp_len=clamp_len)
        start = end
    return out if y is not None else out[:, -1].float().log_softmax(-1)  # (b, 1) NLL or (b, V)


@torch.no_grad()
@_inference_copy
def evaluate_windows(model, ids: torch.Tensor, positions: Sequence[int], *, context: int, segment: int | None = None,
                     clamp_len: int = 0, batch_size: int = 32, device: torch.device | str = "cpu",
                     dtype: str = "float32") -> torch.Tensor:
    """NLL (K,) of ids[p] for each of the K positions p, predicted from exactly the `context` tokens before it and
    nothing else (ids (N,); every p >= context). The window is read in one pass, or with `segment` in segments of
    that length carrying a memory of the whole window (a model with absolute positions counted within segments
    must read so); a recurrent state starts from zeros."""
    device = torch.device(device)
    model.eval()
    out = []
    for x, y in _windows(ids, positions, context, batch_size):
        with autocast(device, dtype):
            nll = _read_window(model, x.to(device), y.to(device), segment=segment, clamp_len=clamp_len)
        out.append(nll[:, 0].float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


@torch.no_grad()
@_inference_copy
def window_log_probs(model, ids: torch.Tensor, positions: Sequence[int], *, context: int, segment: int | None = None,
                     clamp_len: int = 0, batch_size: int = 32, reduce: Reduce | None = None,
                     device: torch.device | str = "cpu", dtype: str = "float32") -> torch.Tensor:
    """As `evaluate_windows`, but the whole distribution: log-probabilities (K, V) of the token at each position, or
    `reduce`(log-probabilities, tokens) (K, F)."""
    device = torch.device(device)
    model.eval()
    out = []
    for x, y in _windows(ids, positions, context, batch_size):
        with autocast(device, dtype):
            lp = _read_window(model, x.to(device), None, segment=segment, clamp_len=clamp_len).cpu()  # (b, V)
        out.append(lp if reduce is None else reduce(lp, y))
    return torch.cat(out) if out else torch.zeros(0, 0)


@torch.no_grad()
@_inference_copy
def stream_log_probs(model, rows: torch.Tensor, row: Sequence[int], col: Sequence[int], *, tgt_len: int,
                     mem_len: int = 0, clamp_len: int = 0, reduce: Reduce | None = None,
                     device: torch.device | str = "cpu", dtype: str = "float32") -> torch.Tensor:
    """Log-probabilities (K, V) of the tokens rows[row_k, col_k] (col_k >= 1), or `reduce`(log-probabilities,
    tokens) (K, F); the B streams rows (B, N) read in segments of T with the memory (or state) carried, as
    `evaluate_segments` reads them with batch_size B. Segments without a chosen position only carry the memory on
    (their NLL path builds no (B, T, V))."""
    device = torch.device(device)
    model.eval()
    row, col = torch.as_tensor(list(row), dtype=torch.long), torch.as_tensor(list(col), dtype=torch.long)
    if col.numel() and (int(col.min()) < 1 or int(col.max()) >= rows.size(1)):
        raise ValueError(f"positions must be in 1 .. {rows.size(1) - 1}")
    out: torch.Tensor | None = None
    mems = None
    streams = LMStreams(rows.reshape(-1), rows.size(0), tgt_len)  # the same rows: N // B = rows.size(1)
    for tau, (x, y) in enumerate(streams):
        here = ((col - 1) // tgt_len == tau).nonzero()[:, 0]  # positions whose input is in this segment
        with autocast(device, dtype):
            if not here.numel():
                _, mems = model(x.to(device), mems, targets=y.to(device), mem_len=mem_len, clamp_len=clamp_len)
                continue
            logits, mems = model(x.to(device), mems, mem_len=mem_len, clamp_len=clamp_len)  # (B, T, V)
        picked = logits[row[here], col[here] - 1 - tau * tgt_len].float().log_softmax(-1).cpu()  # (k, V)
        if reduce is not None:
            picked = reduce(picked, rows[row[here], col[here]])
        out = picked.new_zeros(col.numel(), picked.size(1)) if out is None else out
        out[here] = picked
    return out if out is not None else torch.zeros(0, 0)
