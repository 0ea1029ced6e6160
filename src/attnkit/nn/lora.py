"""LoRA (Hu et al. 2021, "Low-Rank Adaptation of Large Language Models"): a fine-tuning run trains a rank-r update
of a weight, W + (alpha / r) B A, with W frozen, in place of W itself.

N output rows, K inputs, r rank, P adapted row blocks of a packed weight, R rows per block.

An adapter is a parametrization of the weight (`torch.nn.utils.parametrize`), not peft's wrapper around the layer,
for two reasons. The Transformer's attention holds [W^Q; W^K; W^V] as one packed `StackedLinear`, whose `part` reads
row slices of `weight` (a cross-attention's queries and memory): a wrapper adds its update to the layer's forward
only, so `part` would read the weight without it, and the three maps would share one adapter. A parametrized weight
is what every reader of `weight` reads, slices included, so the model's code stays as it is. And the parametrization
comes off again: `merged` computes W + (alpha / r) B A once and leaves a plain model of the same parameter names,
which export, int8, CTranslate2 and ensembles take as any other. Each of q, k and v gets an adapter of its own
(`train.lora_targets`), as the paper adapts W_q and W_v apart, so a packed weight's parametrization adds B_i A_i to its
row block i alone.

An adapted layer's class is the parametrization's, so the CPU room leaves it as it is: its training products are not
padded to the token budget (attnkit.cpu.rows), and the inference copy (attnkit.cpu.for_inference) takes the merged
model, as Trainer.inference_model hands it.

A is drawn as nn.Linear's weights are, B starts at zero, so the adapted model computes at step 0 what the base
model does. The adapters' state-dict entries sit beside the frozen weight (`<layer>.parametrizations.weight.original`,
`...weight.0.lora_A`, `...lora_B`, `...parts`), which is what a resume loads; `merge_state_dict` turns such a state
into the plain one with the same arithmetic. tests/test_lora.py checks step 0, the merge, that only adapters train,
and an exact resume.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from attnkit.errors import ConfigError
from attnkit.nn.attention import MultiHeadAttention, SharedQKAttention
from attnkit.nn.layers import FeedForward

ADAPTED = ".parametrizations."  # in the state-dict keys of an adapted weight


def low_rank_update(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, parts: Sequence[int],
                    scale: float) -> torch.Tensor:
    """W (N, K) with scale * B_i A_i added to its row block parts[i] of R = N / n rows: a (P, r, K), b (P, R, r).
    The one definition of the adapted weight: the parametrization's forward and `merge_state_dict` call it."""
    rows, parts = b.size(1), list(parts)
    delta = torch.bmm(b, a) * scale  # (P, R, r) @ (P, r, K) -> (P, R, K)
    n = weight.size(0) // rows
    if parts == list(range(n)):
        return weight + delta.flatten(0, 1)  # (n, R, K) -> (N, K)
    zero = weight.new_zeros(rows, weight.size(1))  # a block without an adapter
    blocks = [delta[parts.index(i)] if i in parts else zero for i in range(n)]
    return weight + torch.cat(blocks)  # n x (R, K) -> (N, K)


class LowRank(nn.Module):
    """The parametrization W -> W + (alpha / r) B_i A_i on the row blocks `parts` of a weight of `n_parts` blocks."""

    def __init__(self, weight: torch.Tensor, parts: list[int], n_parts: int, rank: int, scale: float):
        super().__init__()
        rows, inputs = weight.size(0) // n_parts, weight.size(1)
        bound = 1 / math.sqrt(inputs)  # nn.Linear's initialisation (kaiming_uniform_, a = sqrt(5)), as peft's A
        self.lora_A = nn.Parameter(weight.new_empty(len(parts), rank, inputs).uniform_(-bound, bound))
        self.lora_B = nn.Parameter(weight.new_zeros(len(parts), rows, rank))  # zero: step 0 is the base model
        self.register_buffer("parts", torch.tensor(parts, dtype=torch.long, device=weight.device))
        self.part_list, self.scale = list(parts), scale  # read by every forward: no device sync for `parts`

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return low_rank_update(weight, self.lora_A, self.lora_B, self.part_list, self.scale)


def _targets(model: nn.Module, targets: Sequence[str]) -> list[tuple[nn.Module, list[int], int]]:
    """(layer, adapted row blocks, row blocks) of every weight `targets` names: q, k, v the row blocks of an attention's
    packed projection (a shared-QK attention's are [q; v]: its keys are its queries), o its W^O (none in a variant
    without one), ffn both products of every FFN."""
    found = []
    for m in list(model.modules()):
        if isinstance(m, MultiHeadAttention):
            layout = ("q", "v") if isinstance(m, SharedQKAttention) else ("q", "k", "v")
            parts = [i for i, name in enumerate(layout) if name in targets]
            found += [(m.in_proj, parts, len(layout))] if parts else []
            found += [(m.out_proj, [0], 1)] if "o" in targets and m.out_proj is not None else []
        elif isinstance(m, FeedForward) and "ffn" in targets:
            found += [(m.w1, [0], 1), (m.w2, [0], 1)]
    return found


def add_lora(model: nn.Module, rank: int, alpha: float, targets: Sequence[str]) -> int:
    """Freeze every parameter of `model` and give the weights `targets` names rank-`rank` adapters, the only
    parameters left to train; returns how many weights were adapted. A model with none of the targets (an RNN) is a
    one-line ConfigError."""
    found = _targets(model, targets)
    if not found:
        raise ConfigError(f"train.lora_targets {', '.join(targets)}: this {type(model).__name__} has no such "
                          "projection (LoRA adapts the Transformer's attention and FFN)")
    model.requires_grad_(False)
    for layer, parts, n_parts in found:
        parametrize.register_parametrization(layer, "weight", LowRank(layer.weight, parts, n_parts, rank,
                                                                      alpha / rank))
    return len(found)


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' A and B of every adapted weight of `model`."""
    return [p for m in model.modules() if isinstance(m, LowRank) for p in (m.lora_A, m.lora_B)]


def merged(model: nn.Module) -> nn.Module:
    """A plain copy of `model`: every adapted weight W + (alpha / r) B A, computed once (remove_parametrizations
    with leave_parametrized), under the names the model had before its adapters. `model` itself keeps them."""
    plain = copy.deepcopy(model)
    for m in [m for m in plain.modules() if parametrize.is_parametrized(m)]:
        _own_class(m)
        for name in list(m.parametrizations):
            parametrize.remove_parametrizations(m, name, leave_parametrized=True)
    return plain


def _own_class(layer: nn.Module) -> None:
    """Give a copied parametrized layer a class of its own. A parametrization puts its property on a class made for
    the layer, which a deepcopy shares; remove_parametrizations deletes the property from that class, which would
    take it from the original layer too (tests/test_lora.py checks the model computes as before after a merge)."""
    cls = type(layer)
    own = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    layer.__class__ = type(cls.__name__, cls.__bases__, own)


def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s state dict with every adapted weight merged (as `merged`'s), without copying the model: what a
    weights-only checkpoint of a LoRA run holds. The state dict itself for a model without adapters."""
    state = model.state_dict()
    if not any(ADAPTED in k for k in state):
        return state
    with torch.no_grad():
        weights = {f"{name}.{tensor}": getattr(m, tensor).detach() for name, m in model.named_modules()
                   if parametrize.is_parametrized(m) for tensor in m.parametrizations}
    return _replace_adapted(state, weights)


def merge_state_dict(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A LoRA model's state dict (adapters beside their frozen weights) as the plain model's, every weight
    W + scale * B A (`low_rank_update`, as the model's forward); a plain state dict is returned as it is."""
    weights = {}
    for key, original in state.items():
        head, adapted, tail = key.partition(ADAPTED)
        if adapted and tail.endswith(".original"):
            tensor = tail.removesuffix(".original")
            at = f"{head}{ADAPTED}{tensor}.0."
            weights[f"{head}.{tensor}"] = low_rank_update(original, state[at + "lora_A"], state[at + "lora_B"],
                                                          state[at + "parts"].tolist(), scale)
    return _replace_adapted(state, weights) if weights else state


def _replace_adapted(state: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with each adapted weight's entries (its frozen original, A, B, parts) replaced by the plain weight in
    `weights`, at the original's place."""
    out = {}
    for key, value in state.items():
        head, adapted, tail = key.partition(ADAPTED)
        if not adapted:
            out[key] = value
        elif tail.endswith(".original"):
            out[f"{head}.{tail.removesuffix('.original')}"] = weights[f"{head}.{tail.removesuffix('.original')}"]
    return out
