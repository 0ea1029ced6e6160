"""The standard workloads through other toolkits: Hugging Face transformers and x-transformers.

Neither is an attnkit dependency (`pip install transformers x-transformers`); `installed(peer)` checks
without importing, and a missing peer becomes a skip note in the tables, never an error. Each peer
keeps its own defaults where WORKLOADS.md is silent; `notes` says which.

- transformers: MT = BartForConditionalGeneration at the workload's shape; LM vanilla = GPT2LMHeadModel
  (learned absolute positions, context 512). transformers 5 has no Transformer-XL (TransfoXL was
  deprecated in 4.35 and removed), so its XL rows are skipped.
- x-transformers: MT = XTransformer; LM vanilla = TransformerWrapper + Decoder with absolute positions,
  max_seq_len 512; LM XL = the same with `max_mem_len` (memory returned by `return_mems=True`, fed back
  by `mems=`, detached) and T5-style relative position bias (`rel_pos_bias`, its defaults: 32 buckets,
  max distance 128), the relative positions it offers with memory.

B batch, S source length, T target / segment length, V vocabulary, D model dim.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from attnkit.eval.speed import BOS, EOS, LMAdapter, LMShape, Mems, MTAdapter, MTShape, Toolkit

PAD = 0
PEERS: dict[str, tuple[str, str]] = {  # name -> (import name, pip name)
    "huggingface": ("transformers", "transformers"),
    "xtransformers": ("x_transformers", "x-transformers"),
}
HF_NO_XL = "transformers 5 has no Transformer-XL (TransfoXL was deprecated in 4.35 and removed in 5.x)"
NOT_MEASURED = {"huggingface": {"lm-train-xl": HF_NO_XL, "lm-eval-xl": HF_NO_XL}}


def installed(peer: str) -> bool:
    return importlib.util.find_spec(PEERS[peer][0]) is not None


def version(peer: str) -> str:
    try:
        return importlib.metadata.version(PEERS[peer][1])
    except importlib.metadata.PackageNotFoundError:
        return ""


def peer_toolkit(name: str) -> Toolkit:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    if name == "huggingface":
        return Toolkit(name, version(name), HF_MT, {"vanilla": HF_VANILLA}, NOT_MEASURED[name])
    return Toolkit(name, version(name), XT_MT, {"vanilla": XT_VANILLA, "xl": XT_XL})


# --- Hugging Face transformers ---------------------------------------------------------------------
def hf_mt_build(s: MTShape) -> nn.Module:
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=s.vocab, d_model=s.d_model, encoder_layers=s.layers, decoder_layers=s.layers,
                     encoder_attention_heads=s.heads, decoder_attention_heads=s.heads, encoder_ffn_dim=s.ffn,
                     decoder_ffn_dim=s.ffn, dropout=s.dropout, attention_dropout=s.dropout,
                     activation_dropout=s.dropout, max_position_embeddings=256, pad_token_id=PAD, bos_token_id=BOS,
                     eos_token_id=EOS, decoder_start_token_id=BOS, forced_bos_token_id=None,
                     forced_eos_token_id=None, scale_embedding=True, tie_word_embeddings=True)
    return BartForConditionalGeneration(cfg)


def hf_mt_logits(model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    return model(input_ids=src, decoder_input_ids=tgt_in).logits  # (B, T, V)


def hf_mt_generate(model: nn.Module, src: torch.Tensor, beam: int, n_new: int) -> torch.Tensor:
    out = model.generate(input_ids=src, max_new_tokens=n_new, min_new_tokens=n_new, num_beams=beam, do_sample=False,
                         length_penalty=1.0, early_stopping=False)  # (B, 1 + n_new)
    return out[:, 1:]  # without the decoder start token


def hf_lm_build(s: LMShape) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=s.vocab, n_positions=s.context, n_embd=s.d_model, n_layer=s.layers, n_head=s.heads,
                     n_inner=s.ffn, resid_pdrop=s.dropout, embd_pdrop=s.dropout, attn_pdrop=s.dropout,
                     bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=True)
    return GPT2LMHeadModel(cfg)


def hf_lm_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    return model(input_ids=x, use_cache=False).logits, None  # (B, T, V)


HF_MT = MTAdapter(hf_mt_build, hf_mt_logits, hf_mt_generate,
                  "BartForConditionalGeneration: post-LN, GELU, learned positions, tied")
HF_VANILLA = LMAdapter(hf_lm_build, hf_lm_forward,
                       "GPT2LMHeadModel: pre-LN, GELU, learned absolute positions, tied")


# --- x-transformers --------------------------------------------------------------------------------
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
