"""The encoder-decoder Transformer ("Attention Is All You Need", Vaswani et al. 2017).

B batch, S source length, T target length, D model dim, H heads, V vocabulary, L layers.

Seq2seq models expose `encode`, `decode` and `step`; incremental decoding keeps its keys and values in
one `DecoderState` whose `reorder(indices)` lets a single beam search serve every model family.

The config's structural switches (all off by default: the paper's model) give Kyubyong Park's TensorFlow
Transformer (docs/kyubyong.md): `output_projection: false` builds every attention as `ConcatHeadsAttention`
(no W^O), `sublayer_dropout: false` keeps `dropout` on the embeddings only, `layer_norm_eps` sets every
LayerNorm's epsilon, and `zero_pad_positions: true` adds no positional encoding at padding positions.
`positions: learned` trains a row per position (ConvS2S, BERT) in place of the sinusoids; `positions: shaw` adds none
and gives every self-attention Shaw et al.'s relative position representations (nn/shaw.py). `residual`, `ffn`,
`scale_scores` and `shared_qk` take one part of the paper's layer away each (no skip connections, no FFN, no
1 / sqrt(d_k), keys from the queries' projection) to measure what it is for. What a Marian (opus-mt)
model needs besides: `activation: swish` (SiLU in the FFN) and `output_bias: true` (a bias on the vocabulary
logits, Marian's final_logits_bias).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.config import PAD_ID, TransformerConfig
from attnkit.models.seq2seq import Seq2Seq
from attnkit.nn import (
    ConcatHeadsAttention,
    DecoderLayer,
    EncoderLayer,
    KVCache,
    MultiHeadAttention,
    SharedQKAttention,
    key_padding_to_attn_mask,
    position_encoding,
)
from attnkit.nn.layers import StepWeights
from attnkit.nn.norms import make_norm, norm_function
from attnkit.nn.outputs import Logits
from attnkit.nn.shaw import self_attention_for


@dataclass
class Encoded:
    """Encoder output: memory (B, S, D), padding (B, S) True at pad, weights per layer when asked."""

    memory: torch.Tensor
    pad_mask: torch.Tensor
    attention: list[torch.Tensor] | None = None


@dataclass
class DecoderState:
    """Everything incremental decoding carries from one step to the next.

    With `beams` > 1 (beam search, see `expand`) rows come in blocks of `beams` consecutive rows per
    source sentence, and the source side is kept once per sentence: the beams of a sentence attend to
    it together as one block of queries, rather than reading beams copies of its keys and values.
    """

    memory_kv: list[KVCache]  # per layer: cross-attention keys/values of the source, computed once
    memory_mask: torch.Tensor | None  # (B, 1, 1, S) True = real source token; None: no padding anywhere
    self_kv: list[KVCache | None]  # per layer: decoder self-attention keys/values so far
    length: int = 0  # target positions already fed
    beams: int = 1  # rows per source sentence
    layers: list[StepWeights] | None = None  # per layer: what its step reads, fetched once per search

    def expand(self, beams: int) -> DecoderState:
        """Each sentence's row becomes `beams` consecutive rows (the start of beam search)."""
        source = self.memory_kv[0].k  # (B, H, S, Dh): B sentences, B * self.beams rows
        rows = torch.arange(source.size(0) * self.beams, device=source.device).repeat_interleave(beams)
        return DecoderState(self.memory_kv, self.memory_mask,
                            [None if kv is None else kv.reorder(rows) for kv in self.self_kv],
                            self.length, self.beams * beams, self.layers)

    def reorder(self, indices: torch.Tensor, *, within_sentences: bool = False) -> DecoderState:
        """Select/reorder batch rows (beam search, dropping finished sentences). `within_sentences`: every
        row keeps its source sentence (beams of one sentence trade places), so the source side stays.
        With beams > 1, `indices` must come in whole blocks: `beams` rows of one sentence each."""
        sentences = indices if self.beams == 1 else indices[:: self.beams] // self.beams
        return DecoderState(
            memory_kv=self.memory_kv if within_sentences else [kv.reorder(sentences) for kv in self.memory_kv],
            memory_mask=(self.memory_mask if within_sentences or self.memory_mask is None
                         else self.memory_mask.index_select(0, sentences)),
            self_kv=[None if kv is None else kv.reorder(indices) for kv in self.self_kv],
            length=self.length,
            beams=self.beams,
            layers=self.layers,
        )


def attention_class(c: TransformerConfig) -> type[MultiHeadAttention]:
    """The paper's attention, or its variant without W^O (`output_projection: false`) or with W^K = W^Q
    (`shared_qk: true`; the config refuses two variants at once)."""
    if c.shared_qk:
        return SharedQKAttention
    return MultiHeadAttention if c.output_projection else ConcatHeadsAttention


def removed_parts(c: TransformerConfig) -> list[str]:
    """The parts of the paper's layer a model goes without, as `model.FIELD: value` settings (none: []): what no
    export format can hold."""
    kept = {"residual": True, "ffn": True, "scale_scores": True, "shared_qk": False, "norm": "layer"}
    return [f"model.{name}: {str(getattr(c, name)).lower()}" for name, value in kept.items()
            if getattr(c, name) != value]


class Transformer(Seq2Seq):
    kind = "transformer"

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        self.embed_scale = math.sqrt(c.d_model)  # section 3.4: embeddings multiplied by sqrt(d_model)
        self.src_embed = self._embedding(c.src_vocab_size)
        # A shared table is registered once, so the state dict (and the checkpoint) holds it once.
        self.own_tgt_embed = None if c.share_embeddings else self._embedding(c.tgt_vocab_size)
        self.positions = position_encoding(c.positions, c.d_model, c.max_positions)
        self.dropout = nn.Dropout(c.dropout)
        block = dict(dropout=c.dropout if c.sublayer_dropout else 0.0, attention_dropout=c.attention_dropout,
                     activation_dropout=c.activation_dropout, activation=c.activation, norm_first=c.norm_first,
                     norm_eps=c.layer_norm_eps, attention=attention_class(c),
                     self_attention=self_attention_for(c.positions, c.relative_clip),
                     ffn=c.ffn, skip=c.residual, scaled=c.scale_scores, norm=c.norm)
        self.encoder = nn.ModuleList(EncoderLayer(c.d_model, c.n_heads, c.d_ff, **block)
                                     for _ in range(c.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c.d_model, c.n_heads, c.d_ff, **block)
                                     for _ in range(c.n_decoder_layers))
        # Pre-LN stacks end with a LayerNorm (or `norm`); post-LN outputs are already normalised.
        self.encoder_norm = make_norm(c.norm, c.d_model, c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = make_norm(c.norm, c.d_model, c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.out_proj = None if c.tie_output else nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        # Marian's final_logits_bias: one bias on the logits whether the output is tied or not, so it is a
        # Parameter of its own (`out_bias` in the state dict), not the untied projection's bias
        self.out_bias = nn.Parameter(torch.zeros(c.tgt_vocab_size)) if c.output_bias else None
        self.logits = Logits()  # h W^T + b, with the weight from `output_layer`

    @classmethod
    def from_config(cls, config: TransformerConfig) -> Transformer:
        return cls(config)

    @property
    def tgt_embed(self) -> nn.Embedding:
        return self.src_embed if self.own_tgt_embed is None else self.own_tgt_embed

    def _embedding(self, vocab_size: int) -> nn.Embedding:
        emb = nn.Embedding(vocab_size, self.config.d_model, padding_idx=PAD_ID)
        nn.init.normal_(emb.weight, mean=0.0, std=self.config.d_model**-0.5)  # unit variance after scaling
        nn.init.zeros_(emb.weight[PAD_ID])
        return emb

    def embed(self, table: nn.Embedding, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = table(ids) * self.embed_scale  # (B, T) -> (B, T, D)
        if self.config.zero_pad_positions:  # padding positions get no position (Kyubyong Park's masking)
            pe = self.positions.encodings(ids.size(1), offset).to(x.dtype)  # (T, D)
            return self.dropout(x + pe * ids.ne(PAD_ID)[..., None])  # (B, T, D) + (T, D) * (B, T, 1)
        return self.dropout(self.positions(x, offset))

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer's weight (V, D), tied to the target embedding or not, and `out_bias` (V,) where the config
        has one: what `project` multiplies by, and what training's loss takes to make the logits a chunk at a time."""
        weight = self.tgt_embed.weight if self.out_proj is None else self.out_proj.weight
        return weight, self.out_bias

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, D) -> vocabulary logits (B, T, V). The one output product of `decode` and `step`."""
        return self.logits(h, *self.output_layer())  # (B, T, D) @ (D, V) + (V,)

    # --- the seq2seq interface -------------------------------------------------------------
    def encode(self, src: torch.Tensor, *, need_weights: bool = False) -> Encoded:
        pad_mask = src.eq(PAD_ID)  # (B, S)
        mask = key_padding_to_attn_mask(pad_mask)  # (B, 1, 1, S)
        x = self.embed(self.src_embed, src)
        keep = self._keep(src)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, mask=mask, need_weights=need_weights, keep=keep)
            weights.append(w)
        return Encoded(self._final(self.encoder_norm, x, keep), pad_mask, weights if need_weights else None)

    def _keep(self, ids: torch.Tensor) -> torch.Tensor | None:
        """(B, T) True at real tokens, for a BatchNorm's statistics (`model.norm: batch`); None for LayerNorms."""
        return ids.ne(PAD_ID) if self.config.norm == "batch" else None

    @staticmethod
    def _final(norm: nn.Module, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """A pre-LN stack's last norm (post-LN: none, nn.Identity)."""
        return x if isinstance(norm, nn.Identity) else norm_function(norm, keep)(x)

    def decode(
        self, tgt_in: torch.Tensor, enc: Encoded, *, need_weights: bool = False
    ) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]] | None]:
        """Teacher-forced decoding: tgt_in (B, T) -> logits (B, T, V) [, {"self", "cross"} per layer]."""
        states, weights = self.decoder_states(tgt_in, enc, need_weights=need_weights)
        return self.project(states), weights

    def decoder_states(
        self, tgt_in: torch.Tensor, enc: Encoded, *, need_weights: bool = False
    ) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]] | None]:
        """Teacher-forced decoding up to the output layer: tgt_in (B, T) -> its input (B, T, D) [, weights]."""
        mask = key_padding_to_attn_mask(enc.pad_mask)
        y = self.embed(self.tgt_embed, tgt_in)
        keep = self._keep(tgt_in)
        weights: dict[str, list[torch.Tensor]] = {"self": [], "cross": []}
        for layer in self.decoder:
            y, w = layer(y, enc.memory, memory_mask=mask, need_weights=need_weights, keep=keep)
            weights["self"].append(w["self"])
            weights["cross"].append(w["cross"])
        return self._final(self.decoder_norm, y, keep), (weights if need_weights else None)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        return self.decode(tgt_in, self.encode(src))[0]

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> the output layer's input (B, T, D): `forward` but for `project`."""
        return self.decoder_states(tgt_in, self.encode(src))[0]

    def attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, dict[str, list]]:
        """Logits plus every attention map: {"encoder", "decoder", "cross"} -> L x (B, H, T, S)."""
        enc = self.encode(src, need_weights=True)
        logits, dec = self.decode(tgt_in, enc, need_weights=True)
        return logits, {"encoder": enc.attention, "decoder": dec["self"], "cross": dec["cross"]}

    def init_state(self, enc: Encoded) -> DecoderState:
        return DecoderState(
            # contiguous (B, H, S, Dh) blocks: every decoding step reads them
            memory_kv=[KVCache(kv.k.contiguous(), kv.v.contiguous())
                       for kv in (layer.cross_attn.project_kv(enc.memory) for layer in self.decoder)],
            memory_mask=key_padding_to_attn_mask(enc.pad_mask) if enc.pad_mask.any() else None,  # faster unmasked
            self_kv=[None] * len(self.decoder),
            layers=[layer.step_weights() for layer in self.decoder],
        )

    def step(
        self, tokens: torch.Tensor, state: DecoderState, *, need_weights: bool = False
    ) -> tuple[torch.Tensor, DecoderState, list[torch.Tensor] | None]:
        """Feed one token per row, tokens (B,) -> log-probs (B, V), new state, cross weights per layer (B, H, S).

        Inference only: teacher forcing (`decode`) is the training path, and the searches put the model in
        eval mode themselves."""
        if self.training:
            raise RuntimeError("Transformer.step is incremental decoding for inference: call model.eval() first "
                               "(greedy_search, beam_search and sample do)")
        y = self.embed(self.tgt_embed, tokens[:, None], offset=state.length)  # (B, 1, D)
        new_kv, cross = [], []
        layers = state.layers or [layer.step_weights() for layer in self.decoder]
        for weights, mem_kv, self_kv in zip(layers, state.memory_kv, state.self_kv):
            if self_kv is None:  # first step: an empty cache of the right shape
                _, h, _, dh = mem_kv.k.shape
                empty = mem_kv.k.new_zeros(tokens.size(0), h, 0, dh)
                self_kv = KVCache(empty, empty)
            y, w, self_kv = DecoderLayer.step(weights, y, mem_kv, memory_mask=state.memory_mask, cache=self_kv,
                                              need_weights=need_weights, beams=state.beams)
            new_kv.append(self_kv)
            if need_weights:
                cross.append(w["cross"][:, :, 0])
        log_probs = self.logits.log_probs(self.decoder_norm(y)[:, 0], *self.output_layer())  # (B, V)
        state = DecoderState(state.memory_kv, state.memory_mask, new_kv, state.length + 1, state.beams, layers)
        return log_probs, state, (cross if need_weights else None)
