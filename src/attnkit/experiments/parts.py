"""The rows of `attnkit experiment parts`: one part of the paper's model taken away per row, by name, with what it
changes and the config overrides that do it (`attnkit.experiments.compare.compare_parts` trains them). No imports,
so that the command line lists them without loading torch."""

PARTS = {
    "paper": ("every part (the preset as it is)", ()),
    "no-residual": ("no residual connections: LayerNorm(Sublayer(x))", ("model.residual=false",)),
    "batch-norm": ("BatchNorm over the batch's tokens instead of LayerNorm", ("model.norm=batch",)),
    "no-ffn": ("no position-wise FFN: attention blocks only", ("model.ffn=false",)),
    "no-wo": ("no W^O: the concatenated heads are the output", ("model.output_projection=false",)),
    "shared-qk": ("keys = queries: W^K = W^Q", ("model.shared_qk=true",)),
    "no-scale": ("no 1 / sqrt(d_k): raw dot products", ("model.scale_scores=false",)),
    "no-positions": ("no positional encoding", ("model.positions=none",)),
    "learned-positions": ("learned absolute positions instead of sinusoids", ("model.positions=learned",)),
    "shaw-positions": ("relative positions (Shaw et al. 2018) instead of sinusoids", ("model.positions=shaw",)),
}
