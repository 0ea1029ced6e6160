"""The encoder-decoder Transformer ("Attention Is All You Need", Vaswani et al. 2017).

B batch, S source length, T target length, D model dim, H heads, V vocabulary, L layers.

Seq2seq models expose `encode`, `decode` and `step`; incremental decoding keeps its keys and values in
one `DecoderState` whose `reorder(indices)` lets a single beam search serve every model family.

The model builds its parts through a few methods (`make_attention`, `make_feed_forward`, `make_norm`, `make_block`,
`embed`); its variants at the end of this file are small subclasses that replace one each, chosen by the config's
`variant` (VARIANTS): one part of the paper's layer taken away or swapped to measure what it is for, and Kyubyong
Park's TensorFlow Transformer (docs/kyubyong.md). `positions: learned` trains a row per position (ConvS2S, BERT) in
place of the sinusoids; `positions: shaw` adds none and gives every self-attention Shaw et al.'s relative position
representations (nn/shaw.py). What a Marian (opus-mt) model needs besides: `activation: swish` (SiLU in the FFN)
and `output_bias: true` (a bias on the vocabulary logits, Marian's final_logits_bias); Marian's own models (Bergamot)
also `norm_eps: 1e-6` and `variant: ssru`, decoder layers whose self-attention is an SSRU (nn/ssru.py), whose
decoding step carries a cell state per layer in `DecoderState.self_kv` where the others carry keys and values.
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
    FeedForward,
    KVCache,
    MultiHeadAttention,
    Residual,
    SharedQKAttention,
    UnscaledAttention,
    Unskipped,
    key_padding_to_attn_mask,
    position_encoding,
)
from attnkit.nn.layers import StepWeights
from attnkit.nn.norms import TokenBatchNorm, norm_function
from attnkit.nn.outputs import Logits
from attnkit.nn.shaw import self_attention_for
from attnkit.nn.ssru import SSRU, SSRUDecoderLayer


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
    # per layer: the decoder self-attention's keys/values so far, or an SSRU layer's cell state c (B, D)
    self_kv: list[KVCache | torch.Tensor | None]
    length: int = 0  # target positions already fed
    beams: int = 1  # rows per source sentence
    layers: list[StepWeights] | None = None  # per layer: what its step reads, fetched once per search

    def expand(self, beams: int) -> DecoderState:
        """Each sentence's row becomes `beams` consecutive rows (the start of beam search)."""
        source = self.memory_kv[0].k  # (B, H, S, Dh): B sentences, B * self.beams rows
        rows = torch.arange(source.size(0) * self.beams, device=source.device).repeat_interleave(beams)
        return DecoderState(self.memory_kv, self.memory_mask,
                            [_reorder(kv, rows) for kv in self.self_kv],
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
            self_kv=[_reorder(kv, indices) for kv in self.self_kv],
            length=self.length,
            beams=self.beams,
            layers=self.layers,
        )


def _reorder(cache: KVCache | torch.Tensor | None, rows: torch.Tensor) -> KVCache | torch.Tensor | None:
    """A layer's step cache with the rows `rows`: a KVCache's, or an SSRU cell state's (B, D) (models: ssru)."""
    if cache is None:
        return None
    return cache.index_select(0, rows) if isinstance(cache, torch.Tensor) else cache.reorder(rows)


def removed_parts(c: TransformerConfig) -> list[str]:
    """The part of the paper's layer a model goes without, as its `model.variant: ...` setting (none: []): what no
    export format can hold. A missing W^O is not one: it leaves as the identity."""
    return [] if VARIANTS[c.variant].exportable else [f"model.variant: {c.variant}"]


class Transformer(Seq2Seq):
    kind = "transformer"
    variant = "paper"  # TransformerConfig.variant: the subclasses at the end of this file
    attention_class: type[MultiHeadAttention] = MultiHeadAttention  # every attention's (Shaw's self-attention aside)
    block_class: type[Residual] = Residual  # every residual block's
    decoder_layer_class: type[nn.Module] = DecoderLayer  # its static `step` is the decoding step of every layer
    exportable = True  # False: a part of the paper's layer taken away, which no export format can hold

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.variant != self.variant:
            raise ValueError(f"the config's variant is {config.variant!r}, this class's {self.variant!r}: build the "
                             "model with Transformer.from_config (or attnkit.models.build_model)")
        c = self.config = config
        self.embed_scale = math.sqrt(c.d_model)  # section 3.4: embeddings multiplied by sqrt(d_model)
        self.src_embed = self._embedding(c.src_vocab_size)
        # A shared table is registered once, so the state dict (and the checkpoint) holds it once.
        self.own_tgt_embed = None if c.share_embeddings else self._embedding(c.tgt_vocab_size)
        self.positions = position_encoding(c.positions, c.d_model, c.max_positions)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(self.make_self_attention(), self.make_feed_forward(),
                                                  self.make_block) for _ in range(c.n_encoder_layers))
        self.decoder = nn.ModuleList(self.make_decoder_layer() for _ in range(c.n_decoder_layers))
        # Pre-LN stacks end with a LayerNorm (or the variant's norm); post-LN outputs are already normalised.
        self.encoder_norm = self.make_norm() if c.norm_first else nn.Identity()
        self.decoder_norm = self.make_norm() if c.norm_first else nn.Identity()
        self.out_proj = None if c.tie_output else nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        # Marian's final_logits_bias: one bias on the logits whether the output is tied or not, so it is a
        # Parameter of its own (`out_bias` in the state dict), not the untied projection's bias
        self.out_bias = nn.Parameter(torch.zeros(c.tgt_vocab_size)) if c.output_bias else None
        self.logits = Logits()  # h W^T + b, with the weight from `output_layer`

    @classmethod
    def from_config(cls, config: TransformerConfig) -> Transformer:
        """The paper's model or the variant the config names (VARIANTS)."""
        return VARIANTS[config.variant](config)

    # --- the parts, which the variants replace ---------------------------------------------------
    def make_attention(self) -> MultiHeadAttention:
        c = self.config
        return self.attention_class(c.d_model, c.n_heads, c.attention_dropout)

    def make_self_attention(self) -> MultiHeadAttention:
        """The layer's attention, or Shaw et al.'s relative self-attention (`positions: shaw`)."""
        c = self.config
        return self_attention_for(c.positions, c.relative_clip, self.attention_class)(c.d_model, c.n_heads,
                                                                                       c.attention_dropout)

    def make_feed_forward(self) -> FeedForward | None:
        c = self.config
        return FeedForward(c.d_model, c.d_ff, c.activation, c.activation_dropout)

    def make_norm(self) -> nn.Module:
        return nn.LayerNorm(self.config.d_model, eps=self.config.norm_eps)

    def make_decoder_layer(self) -> nn.Module:
        """Causal self-attention, cross-attention and the FFN (DecoderLayer); the SSRU variant swaps the first."""
        return DecoderLayer(self.make_self_attention(), self.make_attention(), self.make_feed_forward(),
                            self.make_block)

    def make_block(self) -> Residual:
        """A residual block: `dropout` on the sublayer's output (section 5.4), the norm after the sum or before."""
        c = self.config
        return self.block_class(c.d_model, c.dropout, c.norm_first, self.make_norm())

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
        """(B, T) True at the real tokens, which a BatchNorm's statistics count (BatchNormed); None for LayerNorms."""
        return None

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
        layer_step = self.decoder_layer_class.step  # None in the state: a layer's first step
        for weights, mem_kv, self_kv in zip(layers, state.memory_kv, state.self_kv):
            y, w, self_kv = layer_step(weights, y, mem_kv, memory_mask=state.memory_mask, cache=self_kv,
                                       need_weights=need_weights, beams=state.beams)
            new_kv.append(self_kv)
            if need_weights:
                cross.append(w["cross"][:, :, 0])
        log_probs = self.logits.log_probs(self.decoder_norm(y)[:, 0], *self.output_layer())  # (B, V)
        state = DecoderState(state.memory_kv, state.memory_mask, new_kv, state.length + 1, state.beams, layers)
        return log_probs, state, (cross if need_weights else None)


# --- the variants: one part of the paper's layer taken away or swapped each (`model.variant`) ----------
class NoResidual(Transformer):
    """No residual connections: every block is Norm(Sublayer(x)) (post-LN), without the "x +" of section 3.1."""

    variant, exportable = "no-residual", False
    block_class = Unskipped


class NoFeedForward(Transformer):
    """No position-wise FFN (section 3.3): each layer is its attention blocks alone."""

    variant, exportable = "no-ffn", False

    def make_feed_forward(self) -> None:
        return None


class NoOutputProjection(Transformer):
    """No W^O (section 3.2.2): the concatenated heads are every attention's output (ConcatHeadsAttention)."""

    variant = "no-wo"
    attention_class = ConcatHeadsAttention


class SharedQK(Transformer):
    """Keys from the queries' projection, W^K = W^Q (SharedQKAttention; the Reformer's)."""

    variant, exportable = "shared-qk", False
    attention_class = SharedQKAttention


class NoScale(Transformer):
    """Raw dot products, q . k undivided by sqrt(d_k) (UnscaledAttention; section 3.2.1's reason for the scale)."""

    variant, exportable = "no-scale", False
    attention_class = UnscaledAttention


class BatchNormed(Transformer):
    """Each block's norm a BatchNorm over the batch's real tokens instead of LayerNorm (attnkit.nn.norms)."""

    variant, exportable = "batch-norm", False

    def make_norm(self) -> nn.Module:
        return TokenBatchNorm(self.config.d_model)

    def _keep(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.ne(PAD_ID)  # (B, T)


class Kyubyong(Transformer):
    """Kyubyong Park's TensorFlow Transformer (docs/kyubyong.md): no W^O, `dropout` on the embeddings only (none on
    the sublayers' outputs), LayerNorms of epsilon 1e-8, and no positional encoding at padding positions."""

    variant = "kyubyong"
    attention_class = ConcatHeadsAttention
    layer_norm_eps = 1e-8

    def make_norm(self) -> nn.Module:
        return nn.LayerNorm(self.config.d_model, eps=self.layer_norm_eps)

    def make_block(self) -> Residual:
        return Residual(self.config.d_model, 0.0, self.config.norm_first, self.make_norm())

    def embed(self, table: nn.Embedding, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Padding positions get no position (his `positional_encoding(masking=True)`)."""
        x = table(ids) * self.embed_scale  # (B, T, D)
        pe = self.positions.encodings(ids.size(1), offset).to(x.dtype)  # (T, D)
        return self.dropout(x + pe * ids.ne(PAD_ID)[..., None])  # (B, T, D) + (T, D) * (B, T, 1)


class SSRUDecoder(Transformer):
    """Decoder layers with an SSRU (attnkit.nn.ssru) in place of the causal self-attention: the Bergamot / Firefox
    translation models' decoder (Kim et al. 2019). A decoding step carries each layer's cell state c (B, D), which
    beam search reorders as it reorders a KV cache (`DecoderState.reorder`); the decoder has no self-attention maps,
    so `attention` returns none for it. tests/test_ssru.py checks teacher forcing against the steps."""

    variant, exportable = "ssru", False
    decoder_layer_class = SSRUDecoderLayer

    def make_decoder_layer(self) -> nn.Module:
        return SSRUDecoderLayer(SSRU(self.config.d_model), self.make_attention(), self.make_feed_forward(),
                                self.make_block)

    def attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, dict[str, list]]:
        """As the Transformer's, without "decoder" maps (the SSRU attends to nothing)."""
        logits, maps = super().attention(src, tgt_in)
        del maps["decoder"]
        return logits, maps


VARIANTS: dict[str, type[Transformer]] = {cls.variant: cls for cls in (
    Transformer, NoResidual, NoFeedForward, NoOutputProjection, SharedQK, NoScale, BatchNormed, Kyubyong,
    SSRUDecoder)}
