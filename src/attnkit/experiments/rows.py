"""The rows of the one-change-per-row experiments, by name, with what each row is and the config that makes it
(`attnkit.experiments.compare` trains them). No imports, so that the command line lists them without loading torch.

- `PARTS` (`attnkit experiment parts`): one part of the paper's model taken away per row, as overrides of one preset.
- `ANCESTORS` (`attnkit experiment ancestors`): the line from the fixed-vector encoder-decoder through RNN attention
  (Bahdanau's additive scores, Luong's four scoring functions, hard attention's two estimators) to the Transformer,
  as (preset, overrides) pairs.
"""

PARTS = {
    "paper": ("every part (the preset as it is)", ()),
    "no-residual": ("no residual connections: LayerNorm(Sublayer(x))", ("model.variant=no-residual",)),
    "batch-norm": ("BatchNorm over the batch's tokens instead of LayerNorm", ("model.variant=batch-norm",)),
    "no-ffn": ("no position-wise FFN: attention blocks only", ("model.variant=no-ffn",)),
    "no-wo": ("no W^O: the concatenated heads are the output", ("model.variant=no-wo",)),
    "shared-qk": ("keys = queries: W^K = W^Q", ("model.variant=shared-qk",)),
    "no-scale": ("no 1 / sqrt(d_k): raw dot products", ("model.variant=no-scale",)),
    "no-positions": ("no positional encoding", ("model.positions=none",)),
    "learned-positions": ("learned absolute positions instead of sinusoids", ("model.positions=learned",)),
    "shaw-positions": ("relative positions (Shaw et al. 2018) instead of sinusoids", ("model.positions=shaw",)),
}

ANCESTORS = {
    "fixed-vector": ("GRU decoder reading one fixed vector C (Cho et al. 2014)", "rnn-seq2seq", ()),
    "bahdanau": ("additive attention before the step (Bahdanau et al. 2015)", "rnn-bahdanau", ()),
    "luong-dot": ("Luong et al. 2015, after the step: s_t . h_j", "rnn-luong", ("model.score=dot",)),
    "luong-general": ("Luong et al. 2015: s_t . W_a h_j", "rnn-luong", ("model.score=general",)),
    "luong-concat": ("Luong et al. 2015: v_a . tanh(W_a [s_t; h_j])", "rnn-luong", ("model.score=concat",)),
    "luong-cosine": ("Luong's step, scaled cosine scores beta cos(s_t, h_j)", "rnn-luong", ("model.score=cosine",)),
    "hard-reinforce": ("hard attention, one position sampled, REINFORCE (Xu et al. 2015)", "rnn-hard", ()),
    "hard-gumbel": ("hard attention, straight-through Gumbel-softmax", "rnn-hard", ("model.estimator=gumbel",)),
    "transformer": ("the Transformer (multi30k: 3+3 layers, d 256)", "multi30k", ()),
}
