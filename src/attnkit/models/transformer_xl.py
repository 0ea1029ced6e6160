"""Language models: Transformer-XL (Dai et al. 2019) and its baseline, the vanilla Transformer LM (Al-Rfou et al. 2018).

B batch (parallel streams), T segment length, M memory length, S = M + T attention length, D model dim,
H heads, V vocabulary, L layers.

Both share one interface: `forward(x, mems=None) -> (logits, new_mems)`, where `mems` is an explicit
list of L tensors (B, M, D) — the inputs of each layer over the previous segment(s) — and new_mems is
that list updated with this segment and cut to the last `mem_len` positions. Memory is never stored
on the module, so the caller decides what carries over (ordered training streams, evaluation with a
longer memory, sampling one token at a time). `need_weights=True` adds the attention weights per layer.
Without autograd (evaluation, sampling) the returned `Memory` also carries the memory's keys and values
and the position keys W_{k,R} R of this call's attention length: both are what the next segment would
compute again from unchanged weights, so a caller that passes the memory back pays for its own T positions,
not M + T (exact, and tested). The module keeps no cache of its own: a call without memory computes
everything, and two readers sharing one model never see each other's keys.
`reuse_keys=False` recomputes both every segment, as the XL reference does (`attnkit lm speed --recompute`).
`forward(x, mems, targets=y)` returns the per-token NLL (B, T) in place of the logits: training and
evaluation take that path, which never builds (B, T, V) with the adaptive softmax. Targets shorter than x
score only the last positions: the first ones are extended context.

Extended context (`ext_len` E, the XL reference's `ext_len`): the last E tokens of a segment are read again
at the start of the next one (attnkit.data.lm.LMStreams), as input with full gradient but not predicted,
so the memory keeps the M positions that precede them: concat(memory, segment)[M+T-E-mem_len : M+T-E]
(the reference's `_update_mems`, as its comment and its data iterator define it; its one call passes qlen
and mlen swapped, which changes the result only while the memory holds fewer than E positions: the first
segment, or every one when mem_len < E).

Word embeddings and the output layer are adaptive (`model.cutoffs`, `model.div_val`; attnkit.nn.adaptive):
adaptive input (Baevski & Auli 2019) and the adaptive softmax (Grave et al. 2017) over the same clusters,
tied per cluster (tables and projections) with `tie_output`, as Transformer-XL on WikiText-103. The
"logits" are then log-probabilities (their softmax is the same distribution), so sampling and scoring
code works unchanged. Without cutoffs both are the plain embedding table and full softmax.

- TransformerXL: segment-level recurrence (section 3.2: each layer attends over the stop-gradient
  memory + the segment) and relative positions (section 3.3, `RelativeMultiHeadAttention`).
- VanillaLM: absolute positions (sinusoidal, or learned with `positions: learned`) and causal self-attention
  over one segment; trained on independent segments, it returns no memory.
- RecurrentVanillaLM: the vanilla LM with Transformer-XL's segment recurrence but absolute positions, the
  "Vaswani et al. + recurrence" row of the paper's ablation (section 3.3 explains why it fails): every segment
  gets positions 0 .. T-1 again, so the memory's states, computed with their own segment's positions, carry
  the same position codes as the current segment's (the paper's h = f(h_prev, E + U_{1:L})).

`attends_to_memory` says whether a model's memory is positions it attends to (the XL kinds: attention length =
memory + segment), as opposed to no memory (vanilla) or a recurrent state (attnkit.models.rnn_lm).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.config import TransformerXLConfig
from attnkit.errors import ConfigError
from attnkit.nn import EncoderLayer, FeedForward, causal_mask, position_encoding, sinusoid_table
from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from attnkit.nn.attention import KVCache
from attnkit.nn.layers import Residual
from attnkit.nn.relative import RelativeMultiHeadAttention, position_biases
from attnkit.nn.shaw import self_attention_for

Mems = list[torch.Tensor]  # L tensors (B, M, D)


class XLLayer(nn.Module):
    """Relative self-attention over memory + segment, then the FFN, each in a residual block."""

    def __init__(self, c: TransformerXLConfig):
        super().__init__()
        self.attn = RelativeMultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, own_biases=not c.share_uv)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.dropout)
        self.attn_block = Residual(c.d_model, c.dropout, c.norm_first)
        self.ffn_block = Residual(c.d_model, c.dropout, c.norm_first)

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None, r: torch.Tensor, *, mask: torch.Tensor,
                biases: tuple[torch.Tensor, torch.Tensor] | None = None, mem_kv: KVCache | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, KVCache]:
        """x (B, T, D), mem (B, M, D) or None (or its keys/values mem_kv), r (H, S, Dh) position keys,
        mask (T, S), biases the shared (u, v) or None -> (B, T, D), weights (B, H, T, S) or None, the context's
        keys/values (B, H, S, Dh)."""
        weights = kv = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal weights, kv
            # Pre-LN normalises the memory with the same LayerNorm as the segment (the XL reference's pre_lnorm).
            m = self.attn_block.norm(mem) if mem is not None and mem_kv is None and self.attn_block.norm_first else mem
            out, weights, kv = self.attn(h, m, r, mask=mask, biases=biases, memory_kv=mem_kv,
                                         need_weights=need_weights)
            return out

        x = self.attn_block(x, attend)
        return self.ffn_block(x, self.ffn), weights, kv


class Memory(list):
    """What `mems` holds: L tensors (B, M, D), the inputs of each layer over the last M positions.

    Computed without autograd (evaluation, sampling), it also carries what the next segment would
    compute again from the same weights: each layer's keys and values of those positions (B, H, M, Dh),
    so the next segment projects only its own T positions, and `position_keys`, the (S, clamp_len)
    this call attended over with each layer's W_{k,R} R (H, S, Dh), reused when the next call has the
    same attention length (every segment once the memory is full). `key` says for which weights and
    precision both were computed; they are ignored when that changed. The cache lives here, in the
    object the caller holds, not on the module, so a reader gets exactly the reuse of the memory it
    passes (tests/test_transformer_xl.py::test_the_module_keeps_no_cache_between_calls).
    Anything that builds its own list (or trains) simply gets them recomputed.
    """

    def __init__(self, states: Mems, kv: list[KVCache] | None = None, key: tuple | None = None,
                 position_keys: tuple[int, int, list[torch.Tensor]] | None = None):
        super().__init__(states)
        self.kv, self.key, self.position_keys = kv, key, position_keys


def _rename_legacy_keys(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Checkpoints written before the adaptive softmax kept the output bias as `out_bias`."""
    if prefix + "out_bias" in state_dict:
        state_dict[prefix + "softmax.bias"] = state_dict.pop(prefix + "out_bias")


class LanguageModel(nn.Module):
    """What both LMs share: scaled (adaptive) token embedding, dropout, final norm and the (tied, adaptive) output."""

    kind = ""
    attends_to_memory = False  # its memory is M positions it attends to (attention length M + T)

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        if c.cutoffs and c.cutoffs[-1] >= c.vocab_size:
            raise ConfigError(f"model.cutoffs {c.cutoffs} must stay below the vocabulary size {c.vocab_size}")
        self.embed_scale = math.sqrt(c.d_model)  # as in both reference implementations
        self.embed = AdaptiveEmbedding(c.vocab_size, c.d_model, c.cutoffs, c.div_val)  # unit variance after scaling
        self.dropout = nn.Dropout(c.dropout)
        self.final_norm = self.make_final_norm()
        # the output's own word vectors (`out_proj`, the untied output matrix's name), or tied: the input embedding's
        self.out_proj = None if c.tie_output else AdaptiveEmbedding(c.vocab_size, c.d_model, c.cutoffs, c.div_val)
        self.softmax = AdaptiveLogSoftmax(c.vocab_size, c.d_model, c.cutoffs)
        self.register_load_state_dict_pre_hook(_rename_legacy_keys)

    @classmethod
    def from_config(cls, config) -> LanguageModel:
        if config.kind != cls.kind:
            raise ValueError(f"{cls.__name__} is built from kind {cls.kind!r}, not {config.kind!r}")
        return cls(config)

    def make_final_norm(self) -> nn.Module:
        """Pre-LN stacks end with a LayerNorm; post-LN outputs are already normalised."""
        return nn.LayerNorm(self.config.d_model) if self.config.norm_first else nn.Identity()

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x) * self.embed_scale  # (B, T) -> (B, T, D)

    def output_words(self) -> AdaptiveEmbedding:
        """The output layer's word vectors: the input embedding's when tied."""
        return self.embed if self.out_proj is None else self.out_proj

    def output(self, h: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states (B, T, D) -> logits (B, T, V) (log-probabilities with cutoffs), or with targets
        (B, T' <= T) the per-token NLL (B, T') of the last T' positions (the first T - T' are extended context)."""
        if targets is not None:
            if targets.size(1) > h.size(1):
                raise ValueError(f"{targets.size(1)} targets for {h.size(1)} positions")
            h = h[:, h.size(1) - targets.size(1) :]
        h = self.dropout(self.final_norm(h))
        if targets is None:
            return self.softmax.logits(h, self.output_words())
        return self.softmax.nll(h, self.output_words(), targets)


class TransformerXL(LanguageModel):
    kind = "transformer-xl"
    attends_to_memory = True

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(XLLayer(config) for _ in range(config.n_layers))
        if config.share_uv:  # one u, v for every layer (the XL reference's r_w_bias / r_r_bias without untie_r)
            self.r_w_bias, self.r_r_bias = position_biases(config.n_heads, config.d_model // config.n_heads)

    def shared_biases(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (u, v) pair every layer uses with `share_uv`; None when each layer has its own."""
        return (self.r_w_bias, self.r_r_bias) if self.config.share_uv else None

    def relative_positions(self, s: int, clamp_len: int, device: torch.device) -> torch.Tensor:
        """(S, D) sinusoids of the distances S-1 .. 0, clamped to clamp_len when it is > 0."""
        dist = torch.arange(s - 1, -1, -1, device=device)  # (S,)
        if clamp_len > 0:
            dist = dist.clamp(max=clamp_len)
        table = sinusoid_table(int(dist.max()) + 1, self.config.d_model)  # (max distance + 1, D)
        table = table.to(device=device, dtype=self.embed.weight.dtype)
        return table[dist]  # (S, D)

    def cache_key(self, device: torch.device) -> tuple | None:
        """What cached keys are valid for: these weights (storage and in-place version) at this precision.
        None while autograd is on or in training mode: then nothing is cached."""
        if torch.is_grad_enabled() or self.training:
            return None
        autocast = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type)
        return (autocast, *((p.data_ptr(), p._version, p.dtype) for p in self.parameters()))

    def position_keys(self, s: int, clamp_len: int, device: torch.device,
                      cached: tuple[int, int, list[torch.Tensor]] | None = None) -> list[torch.Tensor]:
        """Per layer W_{k,R} R (H, S, Dh) for the distances S-1 .. 0; `cached` (S', clamp_len', keys), a
        memory's `position_keys` computed with the current weights, is returned when S and clamp_len match."""
        if cached is not None and cached[:2] == (s, clamp_len):
            return cached[2]
        pos = self.dropout(self.relative_positions(s, clamp_len, device))  # (S, D)
        return [layer.attn.position_keys(pos) for layer in self.layers]

    def attention_mask(self, t: int, m: int, mem_len: int, device: torch.device) -> torch.Tensor:
        """(T, S) True = may attend: causal over memory + segment; with same_length, at most mem_len keys."""
        keep = causal_mask(t, m + t, device)  # every memory position precedes every query
        if self.config.same_length and mem_len > 0:
            # distance i - j of query i (absolute position m + i) to key j must stay below mem_len
            dist = torch.arange(m, m + t, device=device)[:, None] - torch.arange(m + t, device=device)  # (T, S)
            keep = keep & (dist < mem_len)
        return keep

    def forward(self, x: torch.Tensor, mems: Mems | None = None, *, targets: torch.Tensor | None = None,
                mem_len: int = 0, clamp_len: int = 0, ext_len: int = 0, need_weights: bool = False,
                reuse_keys: bool = True):
        """x (B, T) ids, mems L x (B, M, D) -> logits (B, T, V) or, given targets (B, T' <= T), the NLL (B, T')
        of the last T' positions; new mems L x (B, <= mem_len, D) (a `Memory`: the positions before the last
        ext_len) [, weights L x (B, H, T, S) when need_weights]. reuse_keys=False: the memory's keys/values and
        the position keys are computed again, not read from the memory (the reference's cost)."""
        key = self.cache_key(x.device) if reuse_keys else None
        # what a memory computed by the same weights carries (even an empty one: its position keys)
        cached = mems if isinstance(mems, Memory) and key is not None and mems.key == key else None
        mems = mems or None
        t, m = x.size(1), 0 if mems is None else mems[0].size(1)
        mem_kv = None if cached is None or mems is None else cached.kv
        h = self.dropout(self.embed_tokens(x))
        rs = self.position_keys(m + t, clamp_len, x.device, None if cached is None else cached.position_keys)
        mask = self.attention_mask(t, m, mem_len, x.device)
        biases = self.shared_biases()
        inputs, weights, kvs = [], [], []
        for i, layer in enumerate(self.layers):
            inputs.append(h)
            h, w, kv = layer(h, None if mems is None else mems[i], rs[i], mask=mask, biases=biases,
                             mem_kv=None if mem_kv is None else mem_kv[i], need_weights=need_weights)
            weights.append(w)
            kvs.append(kv)
        out = self.output(h, targets)
        kept = memory_span(m, t, mem_len, ext_len)
        new_mems = update_mems(mems, inputs, kept)
        if key is not None:  # the keys/values of exactly the positions kept, and this length's position keys
            kept_kv = [KVCache(kv.k[:, :, kept], kv.v[:, :, kept]) for kv in kvs] if new_mems else None
            new_mems = Memory(new_mems, kept_kv, key, (m + t, clamp_len, rs))
        return (out, new_mems, weights) if need_weights else (out, new_mems)


def update_mems(mems: Mems | None, inputs: Mems, kept: slice) -> Memory:
    """Positions `kept` of concat(memory, segment) per layer, cut from the graph (section 3.2: SG)."""
    if kept.stop <= kept.start:
        return Memory([])
    with torch.no_grad():
        if mems is None:
            return Memory([h[:, kept].detach() for h in inputs])
        return Memory([torch.cat([old, h], dim=1)[:, kept].detach() for old, h in zip(mems, inputs)])


def memory_span(m: int, t: int, mem_len: int, ext_len: int = 0) -> slice:
    """Which positions of concat(memory M, segment T) become the next memory: the last mem_len before the
    segment's last ext_len (those are read again as the next segment's first tokens)."""
    if mem_len <= 0:
        return slice(0, 0)
    end = m + max(0, t - ext_len)
    return slice(max(0, end - mem_len), end)


class VanillaLM(LanguageModel):
    """The absolute-position causal Transformer LM; it has no memory (`new_mems` is always empty)."""

    kind = "vanilla-lm"
    layer_class = EncoderLayer  # the block each layer is (the recurrent variant's reads a memory)

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        c = config
        self.positions = position_encoding(c.positions, c.d_model, c.max_positions)
        self.layers = nn.ModuleList(self.make_layer() for _ in range(c.n_layers))

    def make_layer(self) -> EncoderLayer:
        """Causal self-attention (Shaw et al.'s where `positions: shaw`) and the FFN, each in a residual block."""
        c = self.config
        attention = self_attention_for(c.positions, c.relative_clip)(c.d_model, c.n_heads, c.attention_dropout)
        return self.layer_class(attention, FeedForward(c.d_model, c.d_ff, c.activation, c.dropout),
                                lambda: Residual(c.d_model, c.dropout, c.norm_first))

    def forward(self, x: torch.Tensor, mems: Mems | None = None, *, targets: torch.Tensor | None = None,
                mem_len: int = 0, clamp_len: int = 0, ext_len: int = 0, need_weights: bool = False):
        """x (B, T) -> logits (B, T, V) or, given targets (B, T' <= T), the NLL (B, T') of the last T' positions;
        [] [, weights L x (B, H, T, T)]. mems, mem_len, clamp_len, ext_len are ignored."""
        h = self.dropout(self.positions(self.embed_tokens(x)))
        mask = causal_mask(x.size(1), device=x.device)  # (T, T)
        weights = []
        for layer in self.layers:
            h, w = layer(h, mask=mask, need_weights=need_weights)
            weights.append(w)
        out = self.output(h, targets)
        return (out, [], weights) if need_weights else (out, [])


class RecurrentLayer(EncoderLayer):
    """An EncoderLayer whose self-attention reads [memory | segment]: T queries over M + T keys and values, with
    the same projections (the memory is a stop-gradient copy of this layer's inputs over earlier positions)."""

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None = None, *, mask: torch.Tensor | None,  # type: ignore[override]
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D), mem (B, M, D) or None, mask (T, M + T) -> (B, T, D), weights (B, H, T, M + T) or None."""
        weights = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal weights
            if mem is None:
                out, weights = self.self_attn(h, mask=mask, need_weights=need_weights)
                return out
            m = self.attn_block.norm(mem) if self.attn_block.norm_first else mem  # pre-LN: the same LayerNorm
            context = torch.cat([m, h], dim=1)  # (B, M + T, D)
            out, weights = self.self_attn(h, context, mask=mask, need_weights=need_weights)
            return out

        x = self.attn_block(x, attend)
        return self.ffn_block(x, self.ffn), weights


class RecurrentVanillaLM(VanillaLM):
    """The vanilla LM with segment-level recurrence: absolute positions, counted within each segment."""

    kind = "recurrent-vanilla-lm"
    attends_to_memory = True
    layer_class = RecurrentLayer

    def forward(self, x: torch.Tensor, mems: Mems | None = None, *, targets: torch.Tensor | None = None,
                mem_len: int = 0, clamp_len: int = 0, ext_len: int = 0, need_weights: bool = False):
        """x (B, T), mems L x (B, M, D) -> logits (B, T, V) or, given targets (B, T' <= T), the NLL (B, T'); new mems
        L x (B, <= mem_len, D) (as TransformerXL's) [, weights L x (B, H, T, M + T)]. clamp_len is ignored."""
        mems = mems or None
        t, m = x.size(1), 0 if mems is None else mems[0].size(1)
        h = self.dropout(self.positions(self.embed_tokens(x)))  # positions 0 .. T-1, whatever the memory holds
        mask = causal_mask(t, m + t, device=x.device)  # (T, M + T)
        inputs, weights = [], []
        for i, layer in enumerate(self.layers):
            inputs.append(h)
            h, w = layer(h, None if mems is None else mems[i], mask=mask, need_weights=need_weights)
            weights.append(w)
        out = self.output(h, targets)
        new_mems = update_mems(mems, inputs, memory_span(m, t, mem_len, ext_len))
        return (out, new_mems, weights) if need_weights else (out, new_mems)
