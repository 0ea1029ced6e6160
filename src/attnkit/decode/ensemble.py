"""Several models decoding as one: each step's distribution is the average of the members' probabilities.

An ensemble of checkpoints of one run (snapshots of its last epochs, Huang et al. 2017; Sennrich et al.
2016 ensembled the last checkpoints of their WMT systems) needs no more training: the members disagree on
the uncertain words, and averaging their distributions removes part of each one's noise. It answers the
models' encode / init_state / step interface, so greedy search, beam search, sampling and forced scoring
run on it unchanged, at the members' summed cost.

M members, B batch (rows), T target length, V vocabulary, S source length, H heads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.errors import ConfigError


@dataclass
class EnsembleState:
    """The members' decoder states, row for row the same hypotheses."""

    members: list

    def expand(self, beams: int) -> EnsembleState:
        return EnsembleState([s.expand(beams) for s in self.members])

    def reorder(self, indices: torch.Tensor, *, within_sentences: bool = False) -> EnsembleState:
        return EnsembleState([s.reorder(indices, within_sentences=within_sentences) for s in self.members])


class Ensemble(nn.Module):
    """`Ensemble([model, ...])`: translation models with one target vocabulary (checkpoints of one run, or
    of runs on the same prepared data). Its config is the first member's, with the shortest input any
    member accepts."""

    kind = "ensemble"

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        vocabs = {m.config.tgt_vocab_size for m in models}
        if len(vocabs) > 1:
            raise ConfigError(f"the ensemble's models have different target vocabularies ({sorted(vocabs)} "
                              "entries): members must share the prepared data's tokenizers")
        self.members = nn.ModuleList(models)
        self.config = dataclasses.replace(models[0].config,
                                          max_positions=min(m.config.max_positions for m in models))

    def __len__(self) -> int:
        return len(self.members)

    def encode(self, src: torch.Tensor) -> list:
        return [m.encode(src) for m in self.members]

    def init_state(self, encoded: list) -> EnsembleState:
        return EnsembleState([m.init_state(e) for m, e in zip(self.members, encoded)])

    def step(self, tokens: torch.Tensor, state: EnsembleState, *, need_weights: bool = False
             ) -> tuple[torch.Tensor, EnsembleState, list[torch.Tensor] | None]:
        """tokens (B,) -> log of the members' mean probability (B, V), new state, cross weights (mean over the
        members when they have the same layers and heads, else the first member's)."""
        outs = [m.step(tokens, s, need_weights=need_weights) for m, s in zip(self.members, state.members)]
        logp = mean_probability([o[0] for o in outs], dim=0)
        cross = mean_weights([o[2] for o in outs]) if need_weights else None
        return logp, EnsembleState([o[1] for o in outs]), cross

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing, src (B, S), tgt_in (B, T) -> log of the members' mean probability (B, T, V): valid
        logits (their log-softmax is themselves), so forced scoring works as for one model."""
        return mean_probability([m(src, tgt_in).float().log_softmax(-1) for m in self.members], dim=0)


def mean_probability(log_probs: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """log(mean_m exp(log_probs[m])), stably: M tensors of log-probabilities -> one."""
    return torch.stack(log_probs, dim).logsumexp(dim) - math.log(len(log_probs))


def mean_weights(per_member: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Per layer, the members' cross-attention (B, H, S) averaged; the first member's where shapes differ."""
    first = per_member[0]
    same = all(len(w) == len(first) and all(a.shape == b.shape for a, b in zip(w, first)) for w in per_member)
    if not same:
        return first
    return [torch.stack(layer).mean(0) for layer in zip(*per_member)]


__all__ = ["Ensemble", "EnsembleState", "mean_probability"]
