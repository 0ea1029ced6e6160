"""The standard workloads through Hugging Face transformers (`pip install transformers`, not an attnkit dependency).

MT = BartForConditionalGeneration at the workload's shape; LM vanilla = GPT2LMHeadModel (learned absolute
positions, context 512); the mt-opus-* workloads: MarianMTModel.from_pretrained of the opus-mt-shape directory
(bench.opus) and its `generate`. transformers 5 has no Transformer-XL (TransfoXL was deprecated in 4.35 and
removed), so its XL rows are skipped. It keeps its own defaults where WORKLOADS.md is silent; `notes` says which.

B batch, S source length, T target / segment length, V vocabulary, D model dim.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.bench import opus
from attnkit.bench.catalog import OPUS_WORKLOADS, version
from attnkit.bench.workloads import (
    BOS,
    EOS,
    PAD,
    LMAdapter,
    LMShape,
    Mems,
    MTAdapter,
    MTShape,
    Toolkit,
    decoding_only,
)

HF_NO_XL = "transformers 5 has no Transformer-XL (TransfoXL was deprecated in 4.35 and removed in 5.x)"


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


def hf_marian_build(s: MTShape) -> nn.Module:
    from transformers import MarianMTModel

    return MarianMTModel.from_pretrained(opus.ensure(s, ["hf"])["hf"], dtype=torch.float32)


def hf_marian_generate(model: nn.Module, src: torch.Tensor, beam: int, n_new: int) -> torch.Tensor:
    """Marian ids in and out. The directory's generation config bans <pad> (bad_words_ids), as opus-mt's does;
    its forced_eos_token_id (EOS forced at max_length) is switched off, since here EOS is blocked for every toolkit."""
    out = model.generate(input_ids=src, max_new_tokens=n_new, min_new_tokens=n_new, num_beams=beam, do_sample=False,
                         length_penalty=1.0, early_stopping=False, forced_eos_token_id=None)  # (B, 1 + n_new)
    return out[:, 1:]  # without the decoder start (<pad>)


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


HF_MARIAN = MTAdapter(hf_marian_build, decoding_only, hf_marian_generate,
                      "MarianMTModel.from_pretrained of the directory: generate(num_beams, min_new_tokens = "
                      "max_new_tokens = T, length_penalty 1.0, early_stopping False), <pad> banned by the directory's "
                      "bad_words_ids, forced_eos_token_id None (opus-mt forces EOS at max_length)")


def toolkit(variant: str = "") -> Toolkit:
    why = opus.unavailable("hf")
    return Toolkit("huggingface", version("huggingface"), HF_MT, {"vanilla": HF_VANILLA},
                   {"lm-train-xl": HF_NO_XL, "lm-eval-xl": HF_NO_XL, **{w: why for w in OPUS_WORKLOADS if why}},
                   marian=HF_MARIAN)
