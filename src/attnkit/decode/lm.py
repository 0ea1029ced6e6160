"""Reading text with a language model and sampling after it, by one rule per model kind.

B batch, P prompt length, V vocabulary, T the most tokens one forward call reads (`context_rule`: the training
segment for absolute positions, the evaluation segment for relative ones), M the memory carried, W the sliding
window, L layers, H heads.

Every kind is read the way it was trained and evaluated, so no forward call sees a position it never learned:

- Transformer-XL with memory, and the LSTM LM with its state: the text in pieces of at most T tokens, the memory
  (its state) carried from piece to piece, then one token per step with that memory.
- Recurrent vanilla LM (absolute positions 0 .. T-1 in every segment, XL's recurrence): the text cut into segments
  of T from its start, as training cuts it; each full segment becomes memory and the next token is predicted from
  the segment in progress read again over that memory (positions 0 .. p-1), as evaluation predicts it. Fed one
  token per call with memory instead, every memory state would carry position 0.
- Anything without memory (the vanilla LM; XL, recurrent vanilla or LSTM trained or asked with memory 0, the
  `*-no-recurrence` presets): a sliding window of the last T tokens, recomputed every step (Al-Rfou et al. 2018's
  evaluation). One token per step with no memory would make the prompt invisible after the first sampled token.

`context_rule` decides the lengths from the run's config, `open_context` picks the reader; `generate` (the CLI, the
service) and the attention explorer (attnkit.viz.attention.lm_views) both read through them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.cpu import for_inference
from attnkit.decode.search import filter_logits
from attnkit.errors import AttnkitError
from attnkit.models.transformer_xl import LanguageModel, Mems

ABSOLUTE_POSITIONS = ("vanilla-lm", "recurrent-vanilla-lm")  # kinds that learned positions 0 .. tgt_len - 1 only


@dataclass(frozen=True)
class ContextRule:
    """The lengths a model reads with: `segment` the most new tokens one forward call takes (its training segment;
    without memory, its window), `memory` what is carried between calls (0: none, a sliding window), `clamp_len`
    Transformer-XL's clamp on relative distances."""

    segment: int
    memory: int = 0
    clamp_len: int = 0

    def __post_init__(self) -> None:
        if self.segment < 1 or self.memory < 0:
            raise AttnkitError(f"a context of segment {self.segment} and memory {self.memory}: the segment must be "
                               "positive and the memory not negative")


def context_rule(kind: str, cfg, mem_len: int | None = None) -> ContextRule:
    """The rule a `kind` model of run config `cfg` reads with; `mem_len` replaces the run's evaluation memory.

    Absolute positions (the vanilla LMs) were learned only up to train.tgt_len - 1, so no forward call reads more:
    segments of tgt_len, and a vanilla LM (no memory) reads a window of tgt_len, or of `mem_len` when that is
    smaller. Relative positions (Transformer-XL) and an LSTM read with the lengths the run is evaluated with
    (train.eval_tgt_len, eval_mem_len: by default tgt_len and mem_len), the distances `lm eval` scores with."""
    t = cfg.train
    eval_segment, eval_memory = t.eval_lengths
    memory = eval_memory if mem_len is None else mem_len
    if memory < 0:
        raise AttnkitError(f"mem_len {memory}: the memory cannot be negative (0 = none: a sliding window)")
    if kind == "vanilla-lm":
        if mem_len is not None and mem_len > t.tgt_len:
            raise AttnkitError(f"mem_len {mem_len}: a vanilla-lm reads a window of at most its training segment "
                               f"(train.tgt_len {t.tgt_len}); its positions beyond were never trained")
        return ContextRule(segment=mem_len or t.tgt_len, clamp_len=t.clamp_len)
    segment = t.tgt_len if kind in ABSOLUTE_POSITIONS else eval_segment
    return ContextRule(segment=segment, memory=memory, clamp_len=t.clamp_len)


class LMContext:
    """What a model has read so far: `feed(tokens)` reads more and returns the next token's logits.

    Subclasses decide how the text is cut into forward calls (`feed`); `forward` is the one call to the model.
    `weights` holds the attention of the last call when `feed` is asked for it: L x (B, H, Tq, Tk), where the
    first Tk - Tq keys are the memory.
    """

    def __init__(self, model: LanguageModel, rule: ContextRule):
        self.model, self.rule = model, rule
        self.mems: Mems | None = None
        self.weights: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, mems: Mems | None, need_weights: bool) -> tuple[torch.Tensor, Mems]:
        """x (B, t <= segment) over `mems` -> logits (B, t, V), the memory after x."""
        out = self.model(x, mems, mem_len=self.rule.memory, clamp_len=self.rule.clamp_len, need_weights=need_weights)
        if need_weights:
            self.weights = out[2]
        return out[0], out[1]

    def feed(self, tokens: torch.Tensor, *, need_weights: bool = False) -> torch.Tensor:
        """tokens (B, n >= 1) -> the logits (B, V) of the token after them."""
        raise NotImplementedError

    def commit(self) -> None:
        """Make everything read so far memory (the attention explorer draws its next segment over it)."""


class CarriedMemory(LMContext):
    """Transformer-XL with memory, the LSTM LM with its state: pieces of at most `segment` tokens, memory carried."""

    def feed(self, tokens: torch.Tensor, *, need_weights: bool = False) -> torch.Tensor:
        for piece in tokens.split(self.rule.segment, dim=1):  # (B, <= T) each
            logits, self.mems = self.forward(piece, self.mems, need_weights)
        return logits[:, -1]


class AlignedSegments(LMContext):
    """The recurrent vanilla LM: segments of `segment` tokens counted from the start of the text, each full one
    becoming memory; the segment in progress (B, p < T) is read again, over that memory, with every new token."""

    def __init__(self, model: LanguageModel, rule: ContextRule):
        super().__init__(model, rule)
        self.current: torch.Tensor | None = None  # (B, p): the segment in progress

    def feed(self, tokens: torch.Tensor, *, need_weights: bool = False) -> torch.Tensor:
        text = tokens if self.current is None else torch.cat([self.current, tokens], dim=1)  # (B, p + n)
        t = self.rule.segment
        while True:
            segment = text[:, :t]  # (B, <= T): positions 0 .. T-1 at most
            logits, mems = self.forward(segment, self.mems, need_weights)
            if segment.size(1) < t:  # in progress: read again with the next token
                break
            self.mems, text = mems, text[:, t:]  # full: it becomes memory, as in training
            if not text.size(1):
                break
        self.current = text
        return logits[:, -1]

    def commit(self) -> None:
        if self.current is not None and self.current.size(1):
            self.mems = self.forward(self.current, self.mems, False)[1]
            self.current = self.current[:, :0]


class SlidingWindow(LMContext):
    """No memory: every call reads the last `segment` tokens from scratch (B, <= W)."""

    def __init__(self, model: LanguageModel, rule: ContextRule):
        super().__init__(model, rule)
        self.recent: torch.Tensor | None = None  # (B, <= W)

    def feed(self, tokens: torch.Tensor, *, need_weights: bool = False) -> torch.Tensor:
        text = tokens if self.recent is None else torch.cat([self.recent, tokens], dim=1)
        self.recent = text[:, -self.rule.segment :]  # (B, <= W)
        return self.forward(self.recent, None, need_weights)[0][:, -1]


def open_context(model: LanguageModel, rule: ContextRule) -> LMContext:
    """The reader for `model` under `rule` (see the module's docstring for why each kind reads as it does)."""
    if rule.memory == 0 or model.kind == "vanilla-lm":
        return SlidingWindow(model, rule)
    if model.kind == "recurrent-vanilla-lm":
        return AlignedSegments(model, rule)
    return CarriedMemory(model, rule)


@torch.no_grad()
def generate(model: LanguageModel, prompt: torch.Tensor, n_new: int, rule: ContextRule, *,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None,
             on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Sample n_new tokens after prompt (B, P) -> (B, n_new), reading by `rule` (`context_rule`); `on_token` sees
    each step's tokens (B, 1) as they are drawn (a service streams them; an exception it raises stops the
    sampling)."""
    model = for_inference(model.eval())
    context = open_context(model, rule)
    logits = context.feed(prompt)  # (B, V)
    out = []
    for _ in range(n_new):
        probs = filter_logits(logits.float() / max(temperature, 1e-6), top_k, top_p).softmax(-1)  # (B, V)
        token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
        out.append(token)
        if on_token is not None:
            on_token(token)
        if len(out) == n_new:
            break
        logits = context.feed(token)
    return torch.cat(out, dim=1)


def prompt_ids(vocab, prompt: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """A prompt as the LM reads it, (1, P): its ids without the end-of-line token the vocabulary appends (an empty
    prompt is that one token: the start of a line)."""
    ids = vocab.encode([prompt])
    return torch.as_tensor(ids[:-1] if len(ids) > 1 else ids, dtype=torch.long, device=device)[None]


def continuation(vocab, last: int, ids: list[int]) -> str:
    """The text tokens `ids` add after a prompt whose last token is `last`: decoded after it, so that the space a
    word-level or sentencepiece vocabulary puts between tokens stands between the prompt and the first of them."""
    before, text = vocab.decode([last]), vocab.decode([last, *ids])
    return text[len(before):] if text.startswith(before) else vocab.decode(ids)


def sample_text(model: LanguageModel, vocab, cfg, prompt: str, length: int, *, mem_len: int | None = None,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                on_text: Callable[[str], None] | None = None) -> str:
    """`length` tokens sampled after `prompt` with a generator seeded by `seed` (`attnkit lm generate` and the
    service's POST /generate), read by the model's `context_rule` (`mem_len`: its memory, or a vanilla LM's
    window): the continuation's text, to be appended to the prompt. `on_text` gets the text each token adds as it
    is drawn."""
    device = next(model.parameters()).device
    start = prompt_ids(vocab, prompt, device)  # (1, P)
    last = int(start[0, -1])
    ids: list[int] = []
    shown = ""

    def emit(token: torch.Tensor) -> None:  # token (1, 1)
        nonlocal shown
        ids.append(int(token[0, 0]))
        text = continuation(vocab, last, ids)
        delta, shown = (text[len(shown):], text) if text.startswith(shown) else (text, text)
        on_text(delta)

    generator = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, start, length, context_rule(model.kind, cfg, mem_len),
                   temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                   on_token=emit if on_text is not None else None)
    return continuation(vocab, last, out[0].tolist())
