"""How much memory a search needs, so that a batch is cut to fit and a request that cannot fit is refused.

A beam of K over a vocabulary of V scores K * V continuations per sentence and step, and keeps every
layer's keys and values for each of the K hypotheses: `--beam 100000` on an 8k vocabulary is 8 x 10^8 float32
logits alone, several times over once they are log-softmaxed, ranked and reordered. The estimate below is
deliberately an upper bound (every buffer of a step counted as live at once); a test checks it against
the memory a search really takes.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT = 4  # bytes: decoding runs in float32 (bf16 autocast only shrinks it)


@dataclass(frozen=True)
class SearchShape:
    """What a search's memory depends on: the model's sizes and the request's."""

    vocab: int  # target vocabulary
    width: int  # d_model (Transformer) or hidden (RNN)
    layers: int  # decoder layers
    heads: int
    ffn: int  # the feed-forward inner size (Transformer) or the width (RNN)

    @classmethod
    def of(cls, config) -> SearchShape:
        width = getattr(config, "d_model", None) or config.hidden
        return cls(vocab=config.tgt_vocab_size, width=width, layers=config.n_decoder_layers,
                   heads=getattr(config, "n_heads", 1), ffn=getattr(config, "d_ff", width))


def search_bytes(shape: SearchShape, *, sentences: int, expand: int, src_len: int, out_len: int,
                 need_attention: bool = False) -> int:
    """Peak bytes of one search: `sentences` of `src_len` tokens, `expand` rows each (beam or samples),
    up to `out_len` output tokens. An upper estimate."""
    rows, d = sentences * expand, shape.width
    per_row = (6 * shape.vocab  # logits, log-probs, masked and candidate scores, top-k workspace
               + 3 * 2 * shape.layers * out_len * d  # self-attention keys and values, reordered copy, new step
               + 2 * shape.layers * src_len * d  # cross-attention keys and values
               + shape.heads * (out_len + src_len)  # one step's attention weights
               + (2 * shape.heads * out_len * src_len if need_attention else 0)  # the attention kept per token
               + 4 * out_len)  # tokens, scores and back-pointers (int64 counted twice)
    encoder = sentences * src_len * (4 * d + shape.ffn + shape.heads * src_len)  # one layer's activations
    return FLOAT * (rows * per_row + encoder)


def gigabytes(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 / 10 else f"{n / 2**20:.0f} MB"


__all__ = ["SearchShape", "gigabytes", "search_bytes"]
