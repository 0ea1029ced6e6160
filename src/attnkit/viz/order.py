"""Without positions, attention cannot see order (Vaswani et al. 2017, section 3.5: "Since our model contains no
recurrence and no convolution, in order for the model to make use of the order of the sequence, we must inject
some information about the relative or absolute position of the tokens").

An encoder without positional encoding is permutation-equivariant: shuffle its input tokens by a permutation pi
and every layer's output is the original's shuffled by pi, and every attention map A becomes P A P^T (the same
rows, shuffled); a decoder reading that encoder gives the same output for every order of the source. The
sinusoids are what breaks the symmetry. The picture: one encoder self-attention map (a layer, a head) of a
sentence and of a shuffle of it, the shuffle's map put back in the sentence's order, for the same weights without
positions (the two maps are equal) and with sinusoids (they are not).

S source length, H heads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from attnkit.checkpoint import load_checkpoint, model_from
from attnkit.config import TransformerConfig
from attnkit.data.tokenizer import EOS_ID
from attnkit.data.tokenizer_kinds import tokenizer_from_bytes
from attnkit.errors import AttnkitError
from attnkit.models import Transformer
from attnkit.viz.figure import Plot, finish, subplots

FIRST_WORD_ID = 4  # after PAD, BOS, EOS and UNK
RANDOM_MODEL = dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=1, dropout=0.0)


def encoder_maps(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Every encoder self-attention map of one sentence: ids (S,) -> (layers, H, S, S)."""
    with torch.no_grad():
        enc = model.encode(torch.tensor([ids]), need_weights=True)
    return torch.stack([w[0] for w in enc.attention])  # L x (1, H, S, S) -> (L, H, S, S)


def unshuffled(maps: torch.Tensor, order: list[int]) -> torch.Tensor:
    """Maps of the shuffled sentence, whose position i holds the sentence's token order[i], back in the sentence's
    order: the result's [a, b] is the weight the shuffle gave from token a to token b. (..., S, S) -> (..., S, S)."""
    where = torch.argsort(torch.tensor(order))  # where[a]: the shuffled position of the sentence's token a
    return maps[..., where, :][..., :, where]


LABELS = {"none": "no positions", "sinusoidal": "sinusoids", "shaw": "relative positions (Shaw)"}


def _position_weight(key: str) -> bool:
    """A learned position table or Shaw et al.'s relative key and value tables (inside each attention)."""
    return key.startswith("positions.") or key.rsplit(".", 1)[-1] in ("rel_keys", "rel_values")


def with_positions(model: Transformer, positions: str) -> Transformer:
    """The same weights with other positional encoding: "none", or the paper's "sinusoidal" (a learned position
    table and Shaw's relative tables are left out either way); the model itself for its own."""
    if positions == model.config.positions:
        return model
    with torch.random.fork_rng(devices=[]):  # the new model's throwaway initialisation leaves the host's generator
        other = Transformer.from_config(dataclasses.replace(model.config, positions=positions)).eval()
    state = {k: v for k, v in model.state_dict().items() if not _position_weight(k)}
    missing, unexpected = other.load_state_dict(state, strict=False)
    if unexpected or not all(map(_position_weight, missing)):
        raise AttnkitError(f"cannot rebuild the model with positions: {positions}: {[*missing, *unexpected]}")
    return other


def compared(model: Transformer) -> tuple[str, str]:
    """The two encodings the picture sets side by side: none, and the model's own relative positions (a Shaw model:
    order shows through them) or else the paper's sinusoids."""
    return ("none", "shaw") if model.config.positions == "shaw" else ("none", "sinusoidal")


def random_model(vocab_size: int, seed: int) -> Transformer:
    """A small Transformer with seeded random weights: order blindness is a property of the architecture, not of
    training, so untrained weights show it as well as trained ones."""
    config = TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, **RANDOM_MODEL)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Transformer.from_config(config).eval()


def sentence_ids(text: str, checkpoint: str | Path | None, seed: int) -> tuple[Transformer, list[str], list[int]]:
    """The model, the sentence's tokens and their ids (EOS last, as the encoder reads a source): a checkpoint's own
    tokenizer and weights, or words (split at spaces) numbered in order of appearance for a random model."""
    if checkpoint is not None:
        ckpt = load_checkpoint(checkpoint)
        if ckpt.kind != "transformer":
            raise AttnkitError(f"{checkpoint} holds a '{ckpt.kind}' model; plot order draws a Transformer's encoder")
        tok = tokenizer_from_bytes(ckpt.tokenizers["src"])
        ids = tok.encode([text])[0]
        return model_from(ckpt, checkpoint).eval(), [*tok.pieces(ids), "</s>"], [*ids, EOS_ID]
    words = text.split()
    vocab = {w: FIRST_WORD_ID + i for i, w in enumerate(dict.fromkeys(words))}
    return random_model(FIRST_WORD_ID + len(vocab), seed), [*words, "</s>"], [*(vocab[w] for w in words), EOS_ID]


def order_blindness(model: Transformer, ids: list[int], order: list[int]) -> dict[str, torch.Tensor]:
    """The encoder maps (L, H, S, S) of the sentence and of its shuffle `order` (put back in the sentence's order),
    for the model's weights without positions ("none") and with sinusoids ("sinusoidal"), or a Shaw model's own
    relative positions ("shaw")."""
    shuffled = [ids[i] for i in order]
    out = {}
    for name in compared(model):
        net = with_positions(model, name)
        out[f"{name}_sentence"] = encoder_maps(net, ids)
        out[f"{name}_shuffle"] = unshuffled(encoder_maps(net, shuffled), order)
    return out


def shuffle_order(n: int, seed: int) -> list[int]:
    """A permutation of the n tokens that moves the words and keeps EOS last (the encoder reads a sentence ending
    in EOS); for two or more words, never the identity."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n - 1, generator=gen).tolist()
        if n <= 2 or order != sorted(order):
            return [*order, n - 1]


def plot_order_blindness(path: str | Path | None, text: str, *, checkpoint: str | Path | None = None,
                         layer: int = -1, head: int = 1, seed: int = 0) -> Plot:
    """Four maps of one encoder layer and head (both counted from 1; a negative layer from the last): the sentence
    and its shuffle (in the sentence's order), without positions and with sinusoids. `data` holds the maps and each
    pair's largest difference."""
    model, tokens, ids = sentence_ids(text, checkpoint, seed)
    if len(ids) < 3:
        raise AttnkitError("plot order needs a sentence of two or more tokens to shuffle")
    n_layers, n_heads = model.config.n_encoder_layers, model.config.n_heads
    if not (1 <= layer <= n_layers or -n_layers <= layer <= -1) or not 1 <= head <= n_heads:
        raise AttnkitError(f"plot order: --layer {layer} --head {head}, but the encoder has layers 1..{n_layers} "
                           f"(-1 the last) and heads 1..{n_heads}")
    layer, head = (layer - 1 if layer > 0 else layer), head - 1  # indices
    order = shuffle_order(len(ids), seed)
    maps = order_blindness(model, ids, order)
    data = {"tokens": tokens, "order": order, "layer": layer % n_layers + 1, "head": head + 1,
            "compared": compared(model)}
    pairs = {name: [maps[f"{name}_{which}"][layer, head].numpy() for which in ("sentence", "shuffle")]
             for name in compared(model)}
    top = max(float(m.max()) for pair in pairs.values() for m in pair)  # one colour scale for every map
    gaps = {name: np.abs(pair[0] - pair[1]) for name, pair in pairs.items()}
    top_gap = max(max(float(g.max()) for g in gaps.values()), 1e-12)
    fig, axes = subplots(2, 3, 0.32 * len(ids) + 1.6, 0.32 * len(ids) + 1.6)
    shuffled = " ".join(tokens[i] for i in order)
    for row, name in enumerate(compared(model)):
        data[f"{name}_maps"], data[f"{name}_max_difference"] = pairs[name], float(gaps[name].max())
        positions = LABELS[name]
        titles = (f"{positions}: the sentence", f"{positions}: its shuffle, put back\n({shuffled})",
                  f"{positions}: |difference|, largest {data[f'{name}_max_difference']:.1g}")
        for col, (grid, title, vmax) in enumerate(zip([*pairs[name], gaps[name]], titles, (top, top, top_gap))):
            ax = axes[row][col]
            ax.imshow(grid, cmap="magma" if col == 2 else "viridis", vmin=0.0, vmax=vmax)
            ax.set_xticks(range(len(tokens)), tokens, rotation=90)
            ax.set_yticks(range(len(tokens)), tokens)
            ax.set_title(title, fontsize=9)
    fig.suptitle(f"encoder self-attention, layer {data['layer']}, head {data['head']}: without positions the "
                 "shuffle's map is the sentence's, shuffled", fontsize=10)
    return finish(fig, data, path)


__all__ = ["order_blindness", "plot_order_blindness", "shuffle_order", "unshuffled", "with_positions"]
