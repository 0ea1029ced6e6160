"""The standard workloads through x-transformers (`pip install x-transformers`, not an attnkit dependency).

MT = XTransformer; LM vanilla = TransformerWrapper + Decoder with absolute positions, max_seq_len 512; LM XL =
the same with `max_mem_len` (memory returned by `return_mems=True`, fed back by `mems=`, detached) and
T5-style relative position bias (`rel_pos_bias`, its defaults: 32 buckets, max distance 128), the relative
positions it offers with memory. It keeps its own defaults where WORKLOADS.md is silent; `notes` says which.

B batch, S source length, T target / segment length, V vocabulary, D model dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnkit.bench.catalog import version
from attnkit.bench.workloads import BOS, PAD, LMAdapter, LMShape, Mems, MTAdapter, MTShape, Toolkit


def xt_mt_build(s: MTShape) -> nn.Module:
    from x_transformers import XTransformer

    side = dict(num_tokens=s.vocab, depth=s.layers, heads=s.heads, attn_dim_head=s.d_model // s.heads,
                ff_mult=s.ffn // s.d_model, max_seq_len=256, attn_dropout=s.dropout, ff_dropout=s.dropout,
                emb_dropout=s.dropout)
    kw = {f"enc_{k}": v for k, v in side.items()} | {f"dec_{k}": v for k, v in side.items()}
    return XTransformer(dim=s.d_model, tie_token_emb=True, pad_value=PAD, **kw)


def xt_mt_logits(model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    enc = model.encoder(src, return_embeddings=True)  # (B, S, D)
    return model.decoder.net(tgt_in, context=enc)  # (B, T, V)


class _BeamContext(nn.Module):
    """Hands the decoder its encoder context at the batch of its input (B at the first step, B*K after).

    x-transformers 2.31's `beam_search` grows the rows to B*K ('(b beams)' order) but keeps the context
    and the cached cross-attention keys/values at B (`modify_cached_kv` expands self-attention only),
    which fails for an encoder-decoder; repeating each source's rows K times fixes both.
    """

    def __init__(self, net: nn.Module, context: torch.Tensor):
        super().__init__()
        self.net, self.context = net, context  # context (B, S, D)
        for name in ("max_seq_len", "can_cache_kv", "can_cache_kv_outside_max_seq_len", "add_continuous_pred_head"):
            setattr(self, name, getattr(net, name))  # what AutoregressiveWrapper reads from its net

    def forward(self, x: torch.Tensor, cache=None, **kw):  # x (rows, t) -> what the wrapped net returns
        k = x.size(0) // self.context.size(0)
        if cache is not None:
            for inter in cache.attn_intermediates:
                if inter.layer_type == "c" and inter.cached_kv[0].size(0) != x.size(0):
                    inter.cached_kv = [t.repeat_interleave(k, dim=0) for t in inter.cached_kv]  # (B*K, H, S, Dh)
        context = self.context.repeat_interleave(k, dim=0)  # (rows, S, D)
        return self.net(x, context=context, cache=cache, **kw)


def xt_mt_generate(model: nn.Module, src: torch.Tensor, beam: int, n_new: int) -> torch.Tensor:
    from x_transformers import AutoregressiveWrapper

    start = torch.full((src.size(0), 1), BOS, dtype=torch.long)  # (B, 1)
    if beam == 1:
        return model.generate(src, start, n_new, temperature=0.0)  # (B, n_new)
    enc = model.encoder(src, return_embeddings=True)  # (B, S, D)
    searcher = AutoregressiveWrapper(_BeamContext(model.decoder.net, enc), pad_value=PAD)
    return searcher.beam_search(start, n_new, beams=beam)  # (B, n_new), best beam


def xt_lm_build(xl: bool) -> Callable[[LMShape], nn.Module]:
    """XL: T5 relative position bias (no absolute positions) and a memory of M; vanilla: learned positions."""

    def build(s: LMShape) -> nn.Module:
        from x_transformers import Decoder, TransformerWrapper

        layers = Decoder(dim=s.d_model, depth=s.layers, heads=s.heads, attn_dim_head=s.d_model // s.heads,
                         ff_mult=s.ffn // s.d_model, attn_dropout=s.dropout, ff_dropout=s.dropout, rel_pos_bias=xl)
        return TransformerWrapper(num_tokens=s.vocab, max_seq_len=s.context, max_mem_len=s.memory if xl else 0,
                                  emb_dropout=s.dropout, tie_embedding=True, attn_layers=layers)

    return build


def xt_vanilla_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    return model(x), None  # (B, T, V)


def xt_xl_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    return model(x, mems=mems, return_mems=True)  # (B, T, V), L x (B, <= M, D), detached


XT_MT = MTAdapter(xt_mt_build, xt_mt_logits, xt_mt_generate,
                  "XTransformer: pre-LN, GELU, learned positions, tied input embeddings, untied "
                  "output; beam search given the context at B x beams rows (its own keeps B)")
XT_VANILLA = LMAdapter(xt_lm_build(False), xt_vanilla_forward,
                       "TransformerWrapper + Decoder: pre-LN, GELU, learned absolute positions "
                       "(max_seq_len 512), tied; no residual dropout site")
XT_XL = LMAdapter(xt_lm_build(True), xt_xl_forward,
                  "TransformerWrapper + Decoder, max_mem_len 384 (return_mems / mems=, detached), "
                  "T5 relative position bias (rel_pos_bias, 32 buckets, max distance 128), pre-LN, GELU, tied")


def toolkit(variant: str = "") -> Toolkit:
    return Toolkit("xtransformers", version("xtransformers"), XT_MT, {"vanilla": XT_VANILLA, "xl": XT_XL})
