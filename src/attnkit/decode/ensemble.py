"""Several models decoding as one: each step's distribution is the average of the members' probabilities.

An ensemble of checkpoints of one run (snapshots of its last epochs, Huang et al. 2017; Sennrich et al.
2016 ensembled the last checkpoints of their WMT systems) needs no more training: the members disagree on
the uncertain words, and averaging their distributions removes part of each one's noise. It answers the
models' encode / init_state / step / attention interface, so greedy search, beam search, sampling, forced
scoring and the attention pictures run on it unchanged, at the members' summed cost.

Its attention (the alignments of `step`, the maps of `attention`) is the mean of the members' maps, head by
head, where the members are alike (one kind, the same layers and heads: checkpoints of one run); otherwise it
is the first member's. `attention_note` says which, in words for pictures and pages.

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
    member accepts; `alike` says whether its attention is the members' mean (else the first member's)."""

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
        self.alike = len({attention_shape(m.config) for m in models}) == 1

    @property
    def attention_note(self) -> str:
        """Whose attention the ensemble's maps are, as pictures and pages state it."""
        n = len(self.members)
        return (f"mean of the {n} ensemble members" if self.alike else
                f"first of the {n} ensemble members: their kinds, layers or heads differ")

    def __len__(self) -> int:
        return len(self.members)

    def encode(self, src: torch.Tensor) -> list:
        return [m.encode(src) for m in self.members]

    def init_state(self, encoded: list) -> EnsembleState:
        return EnsembleState([m.init_state(e) for m, e in zip(self.members, encoded)])

    def step(self, tokens: torch.Tensor, state: EnsembleState, *, need_weights: bool = False
             ) -> tuple[torch.Tensor, EnsembleState, list[torch.Tensor] | None]:
        """tokens (B,) -> log of the members' mean probability (B, V), new state, cross weights L x (B, H, S):
        the members' mean where they are alike, else the first member's."""
        outs = [m.step(tokens, s, need_weights=need_weights) for m, s in zip(self.members, state.members)]
        logp = mean_probability([o[0] for o in outs], dim=0)
        cross = self._weights([o[2] for o in outs]) if need_weights else None
        return logp, EnsembleState([o[1] for o in outs]), cross

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing, src (B, S), tgt_in (B, T) -> log of the members' mean probability (B, T, V): valid
        logits (their log-softmax is themselves), so forced scoring works as for one model."""
        return mean_probability([m(src, tgt_in).float().log_softmax(-1) for m in self.members], dim=0)

    def attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, dict[str, list]]:
        """Teacher forcing with every attention map, src (B, S), tgt_in (B, T) -> log of the members' mean
        probability (B, T, V) and kind -> L x (B, H, T, S): the members' mean where they are alike (each member's
        own maps, as `model.attention` returns them), else the first member's."""
        first_logits, first_maps = self.members[0].attention(src, tgt_in)
        if self.alike:
            outs = [(first_logits, first_maps), *(m.attention(src, tgt_in) for m in self.members[1:])]
            logits, maps = [o[0] for o in outs], {k: self._weights([o[1][k] for o in outs]) for k in first_maps}
        else:  # the other members need not return maps at all (an RNN without attention)
            logits, maps = [first_logits, *(m(src, tgt_in) for m in self.members[1:])], first_maps
        return mean_probability([x.float().log_softmax(-1) for x in logits], dim=0), maps

    def _weights(self, per_member: list[list[torch.Tensor | None]]) -> list[torch.Tensor | None]:
        """Per layer, the members' weights (B, H, ...) averaged where the members are alike; else the first's. A
        layer some member returns no weights for (None) stays None."""
        if not self.alike:
            return per_member[0]
        return [None if any(w is None for w in layer) else torch.stack(layer).mean(0)  # (M, B, H, ...) -> (B, H, ...)
                for layer in zip(*per_member)]


def attention_shape(config) -> tuple:
    """What fixes the shapes of a model's attention maps: its kind, layers and heads (of those its config has)."""
    return tuple(getattr(config, name, None) for name in ("kind", "n_encoder_layers", "n_decoder_layers", "n_heads"))


def mean_probability(log_probs: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """log(mean_m exp(log_probs[m])), stably: M tensors of log-probabilities -> one."""
    return torch.stack(log_probs, dim).logsumexp(dim) - math.log(len(log_probs))


__all__ = ["Ensemble", "EnsembleState", "mean_probability"]
