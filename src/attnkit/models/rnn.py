"""RNN encoder-decoders, the ancestors of the Transformer: a fixed context vector, soft and hard attention.

B batch, S source length, T target length, E embedding dim, H hidden size (decoder state = encoder
output), A additive-attention size, L decoder layers, V vocabulary.

- `RNNSeq2Seq` (rnn-seq2seq): the decoder sees the source only through one fixed-length vector C, the
  encoder's final state: it starts the decoder and is read at every step (Cho et al. 2014); the source
  may be read backwards (Sutskever et al. 2014).
- `BahdanauSeq2Seq` (rnn-bahdanau): before each step a soft alignment over all encoder states,
  c_i = sum_j a_ij h_j, a_i = softmax_j(v . tanh(W s_{i-1} + U h_j)), masked over padding (Bahdanau et al. 2015).
- `LuongSeq2Seq` (rnn-luong): attention after the step, the attentional state h~_t = tanh(W_c [c_t; s_t])
  predicts y_t and may be fed to the next step (Luong et al. 2015). Its scores (`score`) are the paper's three,
  dot s_t . h_j, general s_t . W_a h_j and concat v_a . tanh(W_a [s_t; h_j]), or cosine: beta cos(s_t, h_j) with a
  learned scale beta (Graves et al. 2014's content addressing; Liu et al. 2022's scaled cosine attention).
- `HardAttentionSeq2Seq` (rnn-hard): Bahdanau's scores, but the context is one encoder state (Xu et al.
  2015): sampled in training and trained by REINFORCE, or by a Gumbel straight-through sample; argmax at
  inference.

The variants override small hooks: `_context` (what the decoder reads from the source), `_keys` and
`_scores` (how a query meets the encoder states), `_select` (soft weights or one position) and
`_decoder_step` (the order of recurrence and attention). All share `encode` / `init_state` / `step` and
`RNNState.reorder`, so greedy, beam search, sampling, scoring and attention pictures work unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnkit.config import PAD_ID, RNNConfig, family
from attnkit.errors import AttnkitError
from attnkit.models.seq2seq import Seq2Seq

BASELINE_DECAY = 0.9  # REINFORCE moving-average baseline, b <- 0.9 b + 0.1 reward (Xu et al. 2015, section 4.2)


@dataclass
class RNNEncoded:
    """Encoder output: states in source order, padding, and the fixed-length summary C."""

    memory: torch.Tensor  # (B, S, H), zeros at padding
    pad_mask: torch.Tensor  # (B, S) True at padding
    final: torch.Tensor  # (B, H) C: the top layer's last states (forward and backward directions)


@dataclass
class Attended:
    """One step's alignment: the weights the context was formed with and the model's distribution."""

    weights: torch.Tensor  # (B, S): soft weights, or one-hot for hard attention
    log_probs: torch.Tensor  # (B, S): log a_t (-inf at padding)


@dataclass
class RNNState:
    """Everything incremental decoding carries from one step to the next."""

    hidden: torch.Tensor  # (L, B, H) decoder RNN state
    cell: torch.Tensor | None  # (L, B, H) LSTM memory cell; None for a GRU
    memory: torch.Tensor  # (B, S, H) encoder states
    keys: torch.Tensor | None  # (B, S, A) the source side of the attention scores, computed once
    pad_mask: torch.Tensor  # (B, S) True at padding
    summary: torch.Tensor  # (B, H) the fixed vector C
    feed: torch.Tensor | None = None  # (B, H) Luong's input feeding: h~_{t-1}
    length: int = 0  # target positions already fed

    def expand(self, beams: int) -> RNNState:
        """Each sentence's row becomes `beams` consecutive rows (the start of beam search)."""
        return self.reorder(torch.arange(self.memory.size(0), device=self.memory.device).repeat_interleave(beams))

    def reorder(self, indices: torch.Tensor, *, within_sentences: bool = False) -> RNNState:
        """Select/reorder batch rows (beam search, dropping finished sentences). `within_sentences`: every
        row keeps its source sentence (beams of one sentence trade places), so the source side stays."""

        def rows(x: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
            return None if x is None else x.index_select(dim, indices)

        def source(x: torch.Tensor | None) -> torch.Tensor | None:
            return x if within_sentences else rows(x)

        return RNNState(rows(self.hidden, 1), rows(self.cell, 1), source(self.memory), source(self.keys),
                        source(self.pad_mask), source(self.summary), rows(self.feed), self.length)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse the first lengths[b] positions of each row along dim 1; padding stays where it is."""
    b, s = x.shape[:2]
    pos = torch.arange(s, device=x.device).expand(b, s)  # (B, S)
    idx = torch.where(pos < lengths[:, None], lengths[:, None] - 1 - pos, pos)
    if x.dim() == 3:
        idx = idx[..., None].expand_as(x)  # (B, S) -> (B, S, H)
    return x.gather(1, idx)


def additive_scores(keys: torch.Tensor, query: torch.Tensor, v: nn.Linear) -> torch.Tensor:
    """v . tanh(U h_j + W s): keys U h_j (B, S, A), computed once per sentence, the projected query W s (B, A)
    -> (B, S). Bahdanau's scores, and Luong's concat."""
    return v(torch.tanh(keys + query[:, None])).squeeze(-1)  # (B, S, A) + (B, 1, A) -> (B, S, 1) -> (B, S)


class RNNSeq2Seq(Seq2Seq):
    """Encoder-decoder with a fixed context vector C; the base of the family, whose hooks the others override."""

    kind = "rnn-seq2seq"

    @property
    def has_attention(self) -> bool:
        """Whether step / attention can return alignments: the family registry says which kinds attend."""
        return bool(family(self.kind).attention)

    def __init__(self, config: RNNConfig):
        super().__init__()
        c = self.config = dataclasses.replace(config, kind=self.kind)  # the class decides the kind
        rnn = nn.GRU if c.cell == "gru" else nn.LSTM
        self.src_embed = self._embedding(c.src_vocab_size)
        # A shared table is registered once, so the state dict (and the checkpoint) holds it once.
        self.own_tgt_embed = None if c.share_embeddings else self._embedding(c.tgt_vocab_size)
        directions = 2 if c.bidirectional else 1
        self.encoder = rnn(c.embed_dim, c.hidden // directions, num_layers=c.n_encoder_layers, batch_first=True,
                           bidirectional=c.bidirectional, dropout=c.dropout if c.n_encoder_layers > 1 else 0.0)
        # s_0 = tanh(W C) for every decoder layer (and LSTM cell): Bahdanau et al. (2015), appendix A.2.2
        self.n_parts = 1 if c.cell == "gru" else 2
        self.bridge = nn.Linear(c.hidden, self.n_parts * c.n_decoder_layers * c.hidden)
        self.decoder = rnn(self.decoder_input_size(), c.hidden, num_layers=c.n_decoder_layers, batch_first=True,
                           dropout=c.dropout if c.n_decoder_layers > 1 else 0.0)
        self.readout = nn.Linear(self.readout_input_size(), c.hidden)
        self.dropout = nn.Dropout(c.dropout)
        self.out_proj = nn.Linear(c.hidden, c.tgt_vocab_size)

    @classmethod
    def from_config(cls, config: RNNConfig) -> RNNSeq2Seq:
        return cls(config)

    @property
    def tgt_embed(self) -> nn.Embedding:
        return self.src_embed if self.own_tgt_embed is None else self.own_tgt_embed

    def _embedding(self, vocab_size: int) -> nn.Embedding:
        emb = nn.Embedding(vocab_size, self.config.embed_dim, padding_idx=PAD_ID)
        nn.init.uniform_(emb.weight, -0.1, 0.1)
        nn.init.zeros_(emb.weight[PAD_ID])
        return emb

    # --- sizes the variants change ----------------------------------------------------------
    def decoder_input_size(self) -> int:
        return self.config.embed_dim + self.config.hidden  # [y_{t-1}; context]

    def readout_input_size(self) -> int:
        return 2 * self.config.hidden + self.config.embed_dim  # [s_t; context; y_{t-1}] (deep output)

    # --- encoder ----------------------------------------------------------------------------
    def encode(self, src: torch.Tensor) -> RNNEncoded:
        """src (B, S) -> encoder states (B, S, H) in source order, padding mask, summary C (B, H)."""
        pad_mask = src.eq(PAD_ID)  # (B, S)
        lengths = (~pad_mask).sum(1)  # (B,)
        ids = reverse_padded(src, lengths) if self.config.reverse_source else src
        x = self.dropout(self.src_embed(ids))  # (B, S, E)
        # Packing runs each row only over its real tokens: padding never reaches a state.
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, last = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))  # (B, S, H)
        if self.config.reverse_source:  # back to source order, so weight j belongs to source token j
            memory = reverse_padded(memory, lengths)
        return RNNEncoded(memory, pad_mask, self._summary(last))

    def _summary(self, last: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Final states (layers * directions, B, H/directions) -> the top layer's, concatenated (B, H)."""
        h = last[0] if isinstance(last, tuple) else last  # an LSTM returns (h, c)
        directions = 2 if self.config.bidirectional else 1
        return h[-directions:].transpose(0, 1).reshape(h.size(1), -1)  # (dirs, B, H/dirs) -> (B, H)

    # --- the seq2seq interface --------------------------------------------------------------
    def init_state(self, enc: RNNEncoded) -> RNNState:
        c = self.config
        b = enc.final.size(0)
        parts = torch.tanh(self.bridge(enc.final))  # (B, P * L * H)
        parts = parts.view(b, self.n_parts, c.n_decoder_layers, c.hidden).permute(1, 2, 0, 3)  # (P, L, B, H)
        return RNNState(hidden=parts[0].contiguous(), cell=parts[1].contiguous() if self.n_parts == 2 else None,
                        memory=enc.memory, keys=self._keys(enc.memory), pad_mask=enc.pad_mask, summary=enc.final)

    def step(self, tokens: torch.Tensor, state: RNNState, *, need_weights: bool = False
             ) -> tuple[torch.Tensor, RNNState, list[torch.Tensor] | None]:
        """Feed one token per row, tokens (B,) -> log-probs (B, V), new state, [weights (B, 1, S)] when asked."""
        if need_weights:
            self._require_attention()
        emb = self.dropout(self.tgt_embed(tokens))  # (B, E)
        features, state, attended = self._decoder_step(emb, state)
        logp = self.project(features).float().log_softmax(dim=-1)  # (B, V)
        return logp, state, ([attended.weights[:, None]] if need_weights else None)  # one layer, one "head"

    def decode(self, tgt_in: torch.Tensor, enc: RNNEncoded, *, need_weights: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced decoding: tgt_in (B, T) -> logits (B, T, V) [, weights (B, 1, T, S)]."""
        features, attended = self._unroll(tgt_in, self.init_state(enc))
        if not need_weights:
            return self.project(features), None
        self._require_attention()
        return self.project(features), torch.stack([a.weights for a in attended], 1)[:, None]  # (B, 1, T, S)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        return self.decode(tgt_in, self.encode(src))[0]

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> the output layer's input (B, T, H), dropped out: `forward` but for its last
        product, which training's loss makes a chunk of rows at a time (models.seq2seq)."""
        features, _ = self._unroll(tgt_in, self.init_state(self.encode(src)))
        return self.dropout(features)

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The output layer's weight (V, H) and bias (V,): what `project` multiplies its dropped-out input by."""
        return self.out_proj.weight, self.out_proj.bias

    def attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, dict[str, list]]:
        """Logits plus the decoder-source alignment: {"cross": [(B, 1, T, S)]} (one layer, one head); hard attention
        adds {"scores": [(B, 1, T, S)]}, the distribution a_t each of its one-hot choices was taken from."""
        self._require_attention()
        features, attended = self._unroll(tgt_in, self.init_state(self.encode(src)))
        maps = {"cross": [torch.stack([a.weights for a in attended], 1)[:, None]]}  # (B, 1, T, S)
        if self.kind == "rnn-hard":
            maps["scores"] = [torch.stack([a.log_probs.exp() for a in attended], 1)[:, None]]
        return self.project(features), maps

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Output features (..., H) -> vocabulary logits (..., V)."""
        return F.linear(self.dropout(features), *self.output_layer())

    # --- the decoder and its hooks ----------------------------------------------------------
    def _unroll(self, tgt_in: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, list[Attended | None]]:
        """Teacher forcing: tgt_in (B, T) -> output features (B, T, H) and each step's alignment.

        C does not depend on the decoder state, so the whole target runs through the RNN in one call;
        it computes exactly what T calls of `_decoder_step` compute.
        """
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        context = state.summary[:, None].expand(-1, tgt_in.size(1), -1)  # (B, H) -> (B, T, H)
        out, _, _ = self._run_rnn(torch.cat([emb, context], -1), state)  # (B, T, H)
        features = torch.tanh(self.readout(torch.cat([out, context, emb], -1)))  # (B, T, H)
        return features, [None] * tgt_in.size(1)

    def _unroll_steps(self, tgt_in: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, list[Attended | None]]:
        """Teacher forcing one `_decoder_step` at a time (the context depends on the previous state)."""
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        features, attended = [], []
        for t in range(tgt_in.size(1)):
            f, state, a = self._decoder_step(emb[:, t], state)
            features.append(f)
            attended.append(a)
        return torch.stack(features, 1), attended  # T x (B, H) -> (B, T, H)

    def _decoder_step(self, emb: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, RNNState, Attended | None]:
        """emb (B, E) of y_{t-1} -> output features (B, H), new state, alignment (None without attention).

        Bahdanau's order: the context is read with s_{t-1}, then s_t = f(s_{t-1}, y_{t-1}, c_t) and
        y_t is predicted from (s_t, c_t, y_{t-1}).
        """
        context, attended = self._context(state.hidden[-1], state)  # query: the top layer's s_{t-1} (B, H)
        out, hidden, cell = self._run_rnn(torch.cat([emb, context], -1)[:, None], state)  # (B, 1, H)
        s = out[:, 0]  # (B, H)
        features = torch.tanh(self.readout(torch.cat([s, context, emb], -1)))  # (B, H)
        return features, dataclasses.replace(state, hidden=hidden, cell=cell, length=state.length + 1), attended

    def _run_rnn(self, x: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Decoder RNN over x (B, T, input) from `state` -> outputs (B, T, H), last hidden and cell (L, B, H)."""
        out, last = self.decoder(x, state.hidden if state.cell is None else (state.hidden, state.cell))
        return (out, last, None) if state.cell is None else (out, last[0], last[1])

    def _context(self, query: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, Attended | None]:
        """What the decoder reads from the source at this step: here always C (B, H), no alignment."""
        return state.summary, None

    def _keys(self, memory: torch.Tensor) -> torch.Tensor | None:
        """The source side of the scores, computed once per sentence: (B, S, H) -> (B, S, A)."""
        return None

    def _scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Alignment scores: query (B, H), keys (B, S, A) -> (B, S)."""
        raise NotImplementedError

    def _select(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Weights the context is formed with, from the alignment log a (B, S): soft attention uses a itself."""
        return log_probs.exp()

    def _attend(self, query: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, Attended]:
        """Context c = sum_j w_j h_j (B, H) over the non-padding encoder states."""
        scores = self._scores(query, state.keys).masked_fill(state.pad_mask, float("-inf"))  # (B, S)
        log_probs = scores.float().log_softmax(-1)
        weights = self._select(log_probs).to(state.memory.dtype)  # (B, S)
        context = torch.bmm(weights[:, None], state.memory)[:, 0]  # (B, 1, S) @ (B, S, H) -> (B, H)
        return context, Attended(weights, log_probs)

    def _require_attention(self) -> None:
        if self.has_attention:
            return
        raise AttnkitError(f"{self.kind} has no attention (the decoder reads one fixed vector C): "
                           "alignments and attention pictures need rnn-bahdanau, rnn-luong or rnn-hard")


class BahdanauSeq2Seq(RNNSeq2Seq):
    """Additive soft attention over all encoder states (Bahdanau et al. 2015)."""

    kind = "rnn-bahdanau"

    def __init__(self, config: RNNConfig):
        super().__init__(config)
        a = self.config.attention_dim or self.config.hidden
        self.key_proj = nn.Linear(self.config.hidden, a, bias=False)  # U_a
        self.query_proj = nn.Linear(self.config.hidden, a)  # W_a (its bias is the MLP's)
        self.score_v = nn.Linear(a, 1, bias=False)  # v_a

    def _unroll(self, tgt_in: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, list[Attended | None]]:
        return self._unroll_steps(tgt_in, state)

    def _context(self, query: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, Attended]:
        return self._attend(query, state)

    def _keys(self, memory: torch.Tensor) -> torch.Tensor:
        return self.key_proj(memory)  # (B, S, H) -> (B, S, A)

    def _scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return additive_scores(keys, self.query_proj(query), self.score_v)


class LuongSeq2Seq(RNNSeq2Seq):
    """Global attention after the RNN step, dot / general / concat / cosine scores, optional input feeding (Luong
    et al. 2015). The source side of every score is computed once per sentence (`_keys`)."""

    kind = "rnn-luong"

    def __init__(self, config: RNNConfig):
        super().__init__(config)
        h, score = self.config.hidden, self.config.score
        a = self.config.attention_dim or h
        # keys: h_j (dot), W_a h_j (general), the h_j half of W_a [s_t; h_j] (concat), h_j / |h_j| (cosine)
        self.key_proj = nn.Linear(h, a if score == "concat" else h, bias=False) if score in ("general", "concat") \
            else nn.Identity()
        if score == "concat":
            self.query_proj = nn.Linear(h, a, bias=False)  # the s_t half of W_a (the paper's has no bias)
            self.score_v = nn.Linear(a, 1, bias=False)  # v_a
        if score == "cosine":  # beta = exp(log_beta), from 10, at most 100 (Liu et al. 2022's bounds on 1 / tau)
            self.log_beta = nn.Parameter(torch.tensor(math.log(10.0)))

    def decoder_input_size(self) -> int:
        return self.config.embed_dim + (self.config.hidden if self.config.input_feeding else 0)  # [y_{t-1}; h~_{t-1}]

    def readout_input_size(self) -> int:
        return 2 * self.config.hidden  # W_c [c_t; s_t]

    def init_state(self, enc: RNNEncoded) -> RNNState:
        state = super().init_state(enc)
        if not self.config.input_feeding:
            return state
        return dataclasses.replace(state, feed=enc.final.new_zeros(enc.final.shape))  # h~_0 = 0

    def _unroll(self, tgt_in: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, list[Attended | None]]:
        return self._unroll_steps(tgt_in, state)

    def _decoder_step(self, emb: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, RNNState, Attended]:
        """s_t = f(s_{t-1}, [y_{t-1}; h~_{t-1}]); c_t from s_t; h~_t = tanh(W_c [c_t; s_t]) predicts y_t."""
        x = emb if state.feed is None else torch.cat([emb, state.feed], -1)  # (B, E [+ H])
        out, hidden, cell = self._run_rnn(x[:, None], state)  # (B, 1, H)
        s = out[:, 0]  # (B, H)
        context, attended = self._attend(s, state)
        h_tilde = torch.tanh(self.readout(torch.cat([context, s], -1)))  # (B, H)
        feed = h_tilde if self.config.input_feeding else None
        return h_tilde, dataclasses.replace(state, hidden=hidden, cell=cell, feed=feed, length=state.length + 1), \
            attended

    def _keys(self, memory: torch.Tensor) -> torch.Tensor:
        if self.config.score == "cosine":
            return F.normalize(memory, dim=-1)  # (B, S, H), unit rows (padding's zero rows stay 0, masked later)
        return self.key_proj(memory)  # (B, S, H) -> (B, S, H), or (B, S, A) for concat

    def _scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if self.config.score == "concat":
            return additive_scores(keys, self.query_proj(query), self.score_v)
        if self.config.score == "cosine":
            query = F.normalize(query, dim=-1) * self.log_beta.clamp(max=math.log(100.0)).exp()  # (B, H)
        return torch.bmm(keys, query[:, :, None]).squeeze(2)  # (B, S, H) @ (B, H, 1) -> (B, S)


class HardAttentionSeq2Seq(BahdanauSeq2Seq):
    """Hard attention: the context is one encoder state, chosen by the additive scores (Xu et al. 2015).

    Training samples the position z_t ~ a_t. With `estimator: reinforce` the likelihood cannot reach the
    scorer through the sample, so `training_features` adds the REINFORCE term -(r_t - b) log a_t(z_t), where
    the reward r_t is the mean log-likelihood of the target tokens the choice can still influence
    (y_t .. y_end; earlier tokens do not depend on it) and b a moving average of the rewards. With
    `estimator: gumbel` the sample is a straight-through Gumbel-softmax (Jang et al. 2017): one-hot in
    the forward pass, the gradient of softmax((log a + g) / tau) in the backward pass, no extra term.
    Inference (eval mode) takes the argmax: all weight on one position.
    """

    kind = "rnn-hard"

    def __init__(self, config: RNNConfig):
        super().__init__(config)
        self.register_buffer("reward_baseline", torch.tensor(float("nan")))  # NaN until the first reward

    def _select(self, log_probs: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.one_hot(log_probs.argmax(-1), log_probs.size(-1)).to(log_probs.dtype)  # (B, S)
        if self.config.estimator == "gumbel":
            return F.gumbel_softmax(log_probs, tau=self.config.gumbel_tau, hard=True)
        picks = torch.multinomial(log_probs.exp(), 1).squeeze(1)  # (B,)
        return F.one_hot(picks, log_probs.size(-1)).to(log_probs.dtype)

    def training_features(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The output layer's input (B, T, H), dropped out, and the summed REINFORCE term (0 with the Gumbel estimator
        or in eval mode), whose rewards come from the logits of those same features."""
        features, attended = self._unroll(tgt_in, self.init_state(self.encode(src)))
        features = self.dropout(features)
        if self.config.estimator == "gumbel" or not self.training:
            return features, 0.0
        logits = F.linear(features, *self.output_layer())  # (B, T, V): the rewards read them detached
        return features, self._reinforce_loss(logits, attended, tgt_out)

    def _reinforce_loss(self, logits: torch.Tensor, attended: list[Attended], tgt_out: torch.Tensor) -> torch.Tensor:
        real = tgt_out.ne(PAD_ID)  # (B, T)
        token_logp = logits.detach().float().log_softmax(-1).gather(2, tgt_out[..., None]).squeeze(2)  # (B, T)
        token_logp = token_logp.masked_fill(~real, 0.0)
        to_go = token_logp.flip(1).cumsum(1).flip(1)  # (B, T): sum of log p(y_u) for u >= t
        reward = to_go / real.flip(1).cumsum(1).flip(1).clamp(min=1)  # per remaining token
        with torch.no_grad():
            mean = reward[real].mean()
            b = mean if torch.isnan(self.reward_baseline) else self.reward_baseline
            advantage = (reward - b).masked_fill(~real, 0.0)
            self.reward_baseline.copy_(BASELINE_DECAY * b + (1 - BASELINE_DECAY) * mean)
        # log a_t(z_t): gather the chosen position (a product with the one-hot would meet -inf at padding)
        chosen = torch.stack([a.log_probs.gather(1, a.weights.argmax(-1, keepdim=True)).squeeze(1)
                              for a in attended], 1)  # T x (B,) -> (B, T)
        return -(advantage * chosen).sum()


__all__ = ["Attended", "BahdanauSeq2Seq", "HardAttentionSeq2Seq", "LuongSeq2Seq", "RNNEncoded", "RNNSeq2Seq",
           "RNNState", "reverse_padded"]
