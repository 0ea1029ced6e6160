"""Transformer-XL language models trained elsewhere, imported as attnkit checkpoints: Hugging Face's
`TransfoXLLMHeadModel` folders (transfo-xl-wt103: config.json, model.safetensors or pytorch_model.bin, vocab.pkl or
vocab.txt) and the state dicts of the reference PyTorch code (kimiyoung/transformer-xl's MemTransformerLM) and
NVIDIA's, whose names are Hugging Face's without `transformer.`. docs/import.md has the mapping table.

L layers, D model dim, H heads, Dh head dim, F FFN dim, V vocabulary, n tail clusters, V_i / D_i cluster i's size
and embedding dim.

The reference's network is attnkit's TransformerXL: post-LN layers of relative attention with the biases u, v
(r_w_bias, r_r_bias) and a ReLU FFN, adaptive input and softmax over frequency-sorted clusters, embeddings scaled
by sqrt(D), no final LayerNorm. What is laid out differently is mapped exactly:

- Positions. The reference's sinusoid is [sines | cosines], attnkit's interleaves them (`halves_order`). R enters
  only through W_{k,R} (`r_net`), so its input columns take attnkit's order and nothing else changes.
- u and v: one pair for the whole model (the PyTorch reference's default) is attnkit's `share_uv`; one pair per
  layer (`untie_r`, as the released models) each layer's own; a global (L, H, Dh) tensor is split by layer.
- q, k, v: `qkv_net` packs them as the [q; k; v] rows of one map, as attnkit's `in_proj`.
- The adaptive softmax's head scores the shortlist, then one logit per tail cluster, in an order that depends on
  the code that trained the model: the TensorFlow reference (which trained the released models, converted by
  Hugging Face) puts cluster i at head column V_0 + i - 1, its `cluster_weight` row i - 1; the PyTorch reference
  and NVIDIA's read it from column -i, row n - i (`cluster_rows`). Hugging Face's names (`transformer.`) mean the
  first, the reference's names the second; attnkit's `cluster_head` row i - 1 is cluster i.
- Cluster 0's projection. With div_val > 1 (or d_embed != D) the reference projects cluster 0 as well
  (`emb_projs.0`, `out_projs.0`); attnkit keeps cluster 0 at D without one, so the projection is multiplied into
  the table (table P^T) and, on the output side, into the head's cluster weights. Hugging Face ties every output
  projection to the input's but cluster 0's (`proj_share_all_but_first`), so such a model's output word vectors
  differ from its input ones: attnkit then gives the output its own tables (`tie_output` false; the tail tables are
  stored twice).
- Tied tensors saved once (safetensors) or twice (torch.save) read the same: a missing output table or projection
  is the input's.

Refused in one line: pre-LN (`pre_lnorm`: the reference has no final LayerNorm, attnkit's pre-LN stacks do), other
attention types than the relative one (attn_type 0), heads that do not split D (n_head x d_head != D), a LayerNorm
epsilon other than 1e-5, and d_embed != D with div_val > 1.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from attnkit.checkpoint import LM_VOCAB, Checkpoint, require_trust
from attnkit.config import LMRunConfig, LMTrainConfig, TransformerXLConfig
from attnkit.data.lm import LMVocab
from attnkit.errors import CheckpointError
from attnkit.formats import inert_pickle
from attnkit.formats.folder import (
    WEIGHT_FILES,
    field,
    read_json,
    read_pickled,
    read_safetensors,
    read_state,
    resolve_source,
    tensors_only,
)
from attnkit.models.transformer_xl import TransformerXL
from attnkit.nn.positions import halves_order

PREFIXES = ("module.", "transformer.")  # DDP's wrapper; Hugging Face's base model (the softmax is `crit.`)
OTHER_WEIGHT_FILES = ("model_state.pt", "model.pt", "checkpoint_best.pt", "checkpoint_last.pt")
VOCAB_FILES = ("vocab.pkl", "vocab.bin", "vocab.txt")
STATE_KEYS = ("model_state", "state_dict", "model")  # where a training checkpoint (a dict) keeps the weights
LAYER_NORM_EPS = 1e-5


def cluster_rows(n: int, reverse: bool) -> torch.Tensor:
    """(n,) attnkit's cluster i (row i - 1 of cluster_head) is `cluster_weight` row rows[i - 1]: i - 1 where the head
    appends the tail clusters' logits in order (the TensorFlow reference, Hugging Face), n - i where in reverse (the
    PyTorch reference's `head_logprob[:, -i]`, NVIDIA's)."""
    return torch.arange(n - 1, -1, -1) if reverse else torch.arange(n)


# --- reading ----------------------------------------------------------------------------------------------------------
class Tensors:
    """The checkpoint's tensors under the reference's names (prefixes dropped), each read with a one-line error naming
    the file and the tensor."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: Path):
        self.path, self.named = path, {}
        # Hugging Face's names (its checkpoints came from the TensorFlow reference's) or the PyTorch reference's
        self.hugging_face = any(k.startswith("transformer.") for k in tensors)
        for key, value in tensors.items():
            name = key
            for prefix in PREFIXES:
                name = name.removeprefix(prefix)
            self.named[name] = (key, value)

    def has(self, name: str) -> bool:
        return name in self.named

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.named:
            raise CheckpointError(f"{self.path}: no tensor '{name}' (truncated, or not a Transformer-XL?)")
        key, t = self.named[name]
        if shape is not None and tuple(t.shape) != shape:
            raise CheckpointError(f"{self.path}: tensor '{key}' has shape {tuple(t.shape)}, the model's sizes make it "
                                  f"{shape}")
        return t.float()

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, read without converting it."""
        if name not in self.named:
            self.get(name)  # the one-line error
        return tuple(self.named[name][1].shape)

    def count(self, pattern: str) -> int:
        """How many of pattern.format(0), pattern.format(1), ... exist (without a gap)."""
        i = 0
        while self.has(pattern.format(i)):
            i += 1
        return i


def _state_dict(obj: object, path: Path) -> dict[str, torch.Tensor]:
    """A torch.save file's weights: a state dict, or a training checkpoint (a dict) holding one."""
    if isinstance(obj, dict):
        for key in STATE_KEYS:
            if isinstance(obj.get(key), dict):
                return tensors_only(obj[key], path)
    return tensors_only(obj, path)


def read_weights(source: Path) -> Tensors:
    """The weights of one file, or of a folder: Hugging Face's files, else the reference's and NVIDIA's names."""
    if source.is_dir():
        if any((source / n).is_file() for n in WEIGHT_FILES):
            return Tensors(*read_state(source))
        found = [source / n for n in OTHER_WEIGHT_FILES if (source / n).is_file()]
        if not found:
            raise CheckpointError(f"{source}: no weights ({', '.join((*WEIGHT_FILES, *OTHER_WEIGHT_FILES))})")
        source = found[0]
    if source.suffix == ".safetensors":
        return Tensors(read_safetensors(source), source)
    obj = read_pickled(source, "reads model.safetensors without it")
    return Tensors(_state_dict(obj, source), source)


def read_config(folder: Path) -> tuple[dict, Path]:
    """Hugging Face's config.json (TransfoXLConfig's fields) where there is one; {} for a bare state dict."""
    path = folder / "config.json"
    if not path.is_file():
        return {}, path
    cfg = read_json(path, "the model's config")
    if cfg.get("model_type", "transfo-xl") != "transfo-xl":
        raise CheckpointError(f"{path}: field 'model_type' is {cfg['model_type']!r}, not 'transfo-xl'")
    return cfg, path


def _symbols_of_text(path: Path) -> list[str]:
    """vocab.txt: a symbol per line (its first field, as the reference's and Hugging Face's Vocab read it)."""
    symbols = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            raise CheckpointError(f"{path}: line {n} is empty (a vocabulary file has a symbol on every line)")
        symbols.append(fields[0])
    return symbols


def _symbols_of_pickle(path: Path) -> list[str]:
    """vocab.pkl / vocab.bin: the pickled tokenizer state of Hugging Face's TransfoXLTokenizer (a plain pickle, read
    by attnkit.formats.inert_pickle) or the same dict through torch.save (read weights-only)."""
    data = path.read_bytes()
    try:
        obj = None if data[:2] == b"PK" else inert_pickle.loads(data)  # PK: torch.save's zip
    except Exception as e:  # noqa: BLE001 - anything unpickling raises is this file's fault
        raise CheckpointError(f"{path}: not a readable pickle (truncated or corrupt?): {e}") from None
    if obj is None or isinstance(obj, int):  # a legacy torch.save file begins with a pickled magic number
        obj = read_pickled(path, "reads a vocab.txt (a symbol per line)")
    symbols = inert_pickle.state_of(obj).get("idx2sym")
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        raise CheckpointError(f"{path}: no field 'idx2sym' (the list of symbols a TransfoXLTokenizer saves)")
    return symbols


def read_vocab(folder: Path, vocab: str | os.PathLike | None) -> tuple[list[str], Path]:
    if vocab is None:
        found = [folder / n for n in VOCAB_FILES if (folder / n).is_file()]
        if not found:
            raise CheckpointError(f"{folder}: no vocabulary ({', '.join(VOCAB_FILES)}); name one with --vocab")
        path = found[0]
    else:
        path = Path(vocab)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file (the vocabulary)")
    if path.suffix == ".txt":
        return _symbols_of_text(path), path
    require_trust(path, "reads a vocab.txt (a symbol per line) without it")
    return _symbols_of_pickle(path), path


# --- the architecture, from the tensors' shapes (config.json where the shapes cannot say) ---------------------------
@dataclasses.dataclass(frozen=True)
class XLShape:
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab_size: int
    cutoffs: list[int]
    div_val: int
    d_embed: int
    shared_uv: str  # "model" (one pair), "stacked" (a global (L, H, Dh) tensor) or "layers" (each layer's own)

    @property
    def bounds(self) -> list[int]:
        return [0, *self.cutoffs, self.vocab_size]


def _uv(t: Tensors, n_layers: int) -> tuple[str, int, int]:
    """Where u, v are kept and (H, Dh)."""
    if t.has("r_w_bias"):
        shape = t.shape("r_w_bias")
        if len(shape) == 3 and shape[0] == n_layers:
            return "stacked", shape[1], shape[2]
        if len(shape) == 2:
            return "model", *shape
        raise CheckpointError(f"{t.path}: tensor 'r_w_bias' has shape {shape}, not (heads, head size) or "
                              f"({n_layers} layers, heads, head size)")
    return "layers", *t.shape("layers.0.dec_attn.r_w_bias")


def _refuse_other_kinds(t: Tensors, cfg: dict, path: Path) -> None:
    if field(cfg, "pre_lnorm", path, bool, False):
        raise CheckpointError(f"{path}: field 'pre_lnorm' is true; attnkit's pre-LN stack ends with a LayerNorm the "
                              "reference's lacks, so it cannot compute this model")
    if field(cfg, "attn_type", path, int, 0) != 0 or not t.has("layers.0.dec_attn.r_net.weight"):
        raise CheckpointError(f"{t.path}: not the relative attention of the paper (attn_type 0: no "
                              "'layers.0.dec_attn.r_net.weight'); attnkit imports that one")
    eps = field(cfg, "layer_norm_epsilon", path, float, LAYER_NORM_EPS)
    if eps != LAYER_NORM_EPS:
        raise CheckpointError(f"{path}: field 'layer_norm_epsilon' is {eps}; attnkit's LayerNorms use {LAYER_NORM_EPS}")


def _clusters(t: Tensors, cfg: dict, path: Path) -> tuple[int, list[int], int, int]:
    """(V, cutoffs, div_val, d_embed) from the embedding tables; with one table, the cutoffs come from config.json."""
    n_tables = t.count("word_emb.emb_layers.{}.weight")
    if n_tables == 0:
        t.get("word_emb.emb_layers.0.weight")  # the one-line error
    shapes = [t.shape(f"word_emb.emb_layers.{i}.weight") for i in range(n_tables)]
    d_embed = shapes[0][1]
    n_tail = t.shape("crit.cluster_weight")[0] if t.has("crit.cluster_weight") else 0
    if n_tables > 1:
        sizes = [s[0] for s in shapes]
        cutoffs = [sum(sizes[: i + 1]) for i in range(n_tables - 1)]
        div_val = max(1, d_embed // max(1, shapes[1][1]))
        for i, s in enumerate(shapes):
            if s[1] != d_embed // div_val**i:
                raise CheckpointError(f"{t.path}: table {i} of the adaptive input is {s[1]} wide, not d_embed "
                                      f"{d_embed} // div_val {div_val}^{i}")
        if n_tail != n_tables - 1:
            raise CheckpointError(f"{t.path}: tensor 'crit.cluster_weight' scores {n_tail} tail clusters, the "
                                  f"input has {n_tables - 1}")
        return sum(sizes), cutoffs, div_val, d_embed
    vocab = shapes[0][0]
    cutoffs = field(cfg, "cutoffs", path, list, []) if n_tail else []
    if len(cutoffs) != n_tail:
        raise CheckpointError(f"{path}: field 'cutoffs' names {len(cutoffs)} tail clusters, the softmax has {n_tail}"
                              if cfg else f"{t.path}: the softmax has {n_tail} tail clusters, whose bounds only "
                              "config.json's 'cutoffs' can give")
    return vocab, [int(c) for c in cutoffs], 1, d_embed


def infer_shape(t: Tensors, cfg: dict, path: Path) -> XLShape:
    _refuse_other_kinds(t, cfg, path)
    n_layers = t.count("layers.{}.dec_attn.qkv_net.weight")
    if n_layers == 0:
        t.get("layers.0.dec_attn.qkv_net.weight")
    qkv = t.shape("layers.0.dec_attn.qkv_net.weight")
    d_model = qkv[1]
    where, heads, head_dim = _uv(t, n_layers)
    if heads * head_dim != d_model or qkv[0] != 3 * d_model:
        raise CheckpointError(f"{t.path}: {heads} heads of {head_dim} make {heads * head_dim}, not d_model {d_model}; "
                              "attnkit's heads split d_model")
    vocab, cutoffs, div_val, d_embed = _clusters(t, cfg, path)
    if div_val > 1 and d_embed != d_model:
        raise CheckpointError(f"{t.path}: d_embed {d_embed} differs from d_model {d_model} with div_val {div_val}; "
                              "attnkit's cluster i is d_model // div_val^i wide")
    for name, value, have in (("n_layer", n_layers, "layers"), ("d_model", d_model, "d_model"),
                              ("vocab_size", vocab, "vocabulary"), ("div_val", div_val, "div_val")):
        if cfg.get(name) is not None and field(cfg, name, path, int) != value:
            raise CheckpointError(f"{path}: field '{name}' is {cfg[name]}, the weights' {have} {value}")
    d_ff = t.shape("layers.0.pos_ff.CoreNet.0.weight")[0]
    return XLShape(n_layers, d_model, heads, d_ff, vocab, cutoffs, div_val, d_embed, where)


# --- the mapping ------------------------------------------------------------------------------------------------------
def _input_words(t: Tensors, s: XLShape) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The adaptive input's word vectors per cluster as the reference holds them: tables (V_i, D_i) and projections
    (D, D_i) or None."""
    b = s.bounds
    if s.div_val == 1:
        full = t.get("word_emb.emb_layers.0.weight", (s.vocab_size, s.d_embed))
        proj = t.get("word_emb.emb_projs.0", (s.d_model, s.d_embed)) if t.has("word_emb.emb_projs.0") else None
        return [full[b[i]:b[i + 1]] for i in range(len(b) - 1)], [proj] * (len(b) - 1)
    tables = [t.get(f"word_emb.emb_layers.{i}.weight") for i in range(len(b) - 1)]
    return tables, [t.get(f"word_emb.emb_projs.{i}", (s.d_model, tables[i].shape[1])) for i in range(len(b) - 1)]


def _output_words(t: Tensors, s: XLShape, tables_in: list[torch.Tensor], projs_in: list[torch.Tensor | None]
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The softmax's word vectors per cluster, each tensor the checkpoint lacks the input's (tied)."""
    b, n = s.bounds, len(tables_in)
    full = t.get("crit.out_layers.0.weight", (s.vocab_size, s.d_embed)) if s.div_val == 1 and t.has(
        "crit.out_layers.0.weight") else None  # div_val 1: one table, sliced by cluster as the input's
    tables = [full[b[i]:b[i + 1]] if full is not None else
              t.get(f"crit.out_layers.{i}.weight", tuple(tables_in[i].shape))
              if t.has(f"crit.out_layers.{i}.weight") else tables_in[i] for i in range(n)]
    # one projection per cluster, div_val 1 too (there each of them d_embed wide)
    projs = [t.get(f"crit.out_projs.{i}", (s.d_model, tables[i].shape[1]))
             if t.has(f"crit.out_projs.{i}") else projs_in[i] for i in range(n)]
    return tables, projs


def _attnkit_words(tables: list[torch.Tensor], projs: list[torch.Tensor | None], s: XLShape, prefix: str
                   ) -> dict[str, torch.Tensor]:
    """attnkit's AdaptiveEmbedding of those clusters: cluster 0 (and every cluster with div_val 1) at D, its
    projection multiplied in; the tail clusters of div_val > 1 keep table and projection."""
    def at_d(i: int) -> torch.Tensor:
        return tables[i] if projs[i] is None else tables[i] @ projs[i].T  # (V_i, D)

    out = {f"{prefix}.weight": at_d(0)}
    for i in range(1, len(tables)):
        out[f"{prefix}.tables.{i - 1}"] = at_d(i) if s.div_val == 1 else tables[i]
        if s.div_val > 1:
            out[f"{prefix}.projs.{i - 1}"] = projs[i]
    return out


def _softmax(t: Tensors, s: XLShape, head_proj: torch.Tensor | None) -> dict[str, torch.Tensor]:
    b, n = s.bounds, len(s.cutoffs)
    if s.div_val == 1:
        bias = t.get("crit.out_layers.0.bias", (s.vocab_size,))
    else:
        bias = torch.cat([t.get(f"crit.out_layers.{i}.bias", (b[i + 1] - b[i],)) for i in range(n + 1)])
    out = {"softmax.bias": bias}
    if n:
        weight = t.get("crit.cluster_weight", (n, s.d_embed))
        weight = weight if head_proj is None else weight @ head_proj.T  # (n, D): the head's projection multiplied in
        rows = cluster_rows(n, reverse=not t.hugging_face)
        out["softmax.cluster_head.weight"] = weight[rows]
        out["softmax.cluster_head.bias"] = t.get("crit.cluster_bias", (n,))[rows]
    return out


def _layer(t: Tensors, s: XLShape, i: int) -> dict[str, torch.Tensor]:
    d, a, f, ours = s.d_model, f"layers.{i}.dec_attn", f"layers.{i}.pos_ff", f"layers.{i}"
    out = {f"{ours}.attn.in_proj.weight": t.get(f"{a}.qkv_net.weight", (3 * d, d)),
           f"{ours}.attn.pos_proj.weight": t.get(f"{a}.r_net.weight", (d, d))[:, halves_order(d)],
           f"{ours}.attn.out_proj.weight": t.get(f"{a}.o_net.weight", (d, d)),
           f"{ours}.ffn.w1.weight": t.get(f"{f}.CoreNet.0.weight", (s.d_ff, d)),
           f"{ours}.ffn.w1.bias": t.get(f"{f}.CoreNet.0.bias", (s.d_ff,)),
           f"{ours}.ffn.w2.weight": t.get(f"{f}.CoreNet.3.weight", (d, s.d_ff)),
           f"{ours}.ffn.w2.bias": t.get(f"{f}.CoreNet.3.bias", (d,))}
    for theirs, block in ((f"{a}.layer_norm", "attn_block"), (f"{f}.layer_norm", "ffn_block")):
        for p in ("weight", "bias"):
            out[f"{ours}.{block}.norm.{p}"] = t.get(f"{theirs}.{p}", (d,))
    uv = (s.n_heads, d // s.n_heads)
    if s.shared_uv == "layers":
        out.update({f"{ours}.attn.{p}": t.get(f"{a}.{p}", uv) for p in ("r_w_bias", "r_r_bias")})
    elif s.shared_uv == "stacked":
        out.update({f"{ours}.attn.{p}": t.get(p, (s.n_layers, *uv))[i] for p in ("r_w_bias", "r_r_bias")})
    return out


def map_state(t: Tensors, s: XLShape) -> tuple[dict[str, torch.Tensor], bool]:
    """attnkit's state dict, and whether the output's word vectors are the input's (tie_output)."""
    tables_in, projs_in = _input_words(t, s)
    tables_out, projs_out = _output_words(t, s, tables_in, projs_in)
    state = _attnkit_words(tables_in, projs_in, s, "embed")
    output = _attnkit_words(tables_out, projs_out, s, "out_proj")
    tied = all(torch.equal(output[f"out_proj.{k.removeprefix('embed.')}"], v) for k, v in state.items())
    if not tied:
        state.update(output)
    state.update(_softmax(t, s, projs_out[0]))
    for i in range(s.n_layers):
        state.update(_layer(t, s, i))
    if s.shared_uv == "model":
        state.update({p: t.get(p, (s.n_heads, s.d_model // s.n_heads)) for p in ("r_w_bias", "r_r_bias")})
    # each its own storage: slices of one table, and the tables both sides share, are saved apart
    return {k: v.clone(memory_format=torch.contiguous_format) for k, v in state.items()}, tied


def _check_names(state: dict[str, torch.Tensor], config: TransformerXLConfig) -> None:
    """The mapped state holds exactly the model's tensors at their shapes (a model on the meta device: no memory)."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in TransformerXL(config).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != expected:
        diff = sorted(set(got.items()) ^ set(expected.items()))
        raise AssertionError(f"the Transformer-XL mapping does not fill attnkit's model: {diff[:4]}")


def import_transformer_xl(source: str | os.PathLike, *, vocab: str | os.PathLike | None = None) -> Checkpoint:
    """A Transformer-XL LM (a Hugging Face TransfoXLLMHeadModel folder, the reference's or NVIDIA's state dict, a
    folder or a file) -> an attnkit LM checkpoint with its word-level vocabulary inside. Pickled files are read
    only when trusted (`--trust-checkpoint`); see the module docstring for what maps how."""
    path = Path(source)
    folder = path.parent if path.is_file() else resolve_source(source)
    tensors = read_weights(path if path.is_file() else folder)
    cfg, cfg_path = read_config(folder)
    shape = infer_shape(tensors, cfg, cfg_path)
    state, tied = map_state(tensors, shape)
    symbols, vocab_path = read_vocab(folder, vocab)
    if len(symbols) != shape.vocab_size:
        raise CheckpointError(f"{vocab_path}: {len(symbols):,} symbols for a model of {shape.vocab_size:,} words")
    raw = cfg.get("clamp_len")  # the reference's "none" is 0 or -1
    clamp = 0 if isinstance(raw, int) and not isinstance(raw, bool) and raw < 0 else field(cfg, "clamp_len", cfg_path,
                                                                                         int, 0)
    config = TransformerXLConfig(
        kind="transformer-xl", vocab_size=shape.vocab_size, d_model=shape.d_model, n_heads=shape.n_heads,
        d_ff=shape.d_ff, n_layers=shape.n_layers, dropout=field(cfg, "dropout", cfg_path, float, 0.1),
        attention_dropout=field(cfg, "dropatt", cfg_path, float, 0.0), activation="relu", norm_first=False,
        same_length=field(cfg, "same_length", cfg_path, bool, False), share_uv=shape.shared_uv == "model",
        tie_output=tied, cutoffs=shape.cutoffs, div_val=shape.div_val)
    _check_names(state, config)
    tgt_len = field(cfg, "tgt_len", cfg_path, int, 128) or 128
    train = LMTrainConfig(tgt_len=tgt_len, mem_len=field(cfg, "mem_len", cfg_path, int, tgt_len), clamp_len=clamp)
    return Checkpoint(kind="transformer-xl", config=LMRunConfig(model=config, train=train), model_state=state,
                      tokenizers={LM_VOCAB: LMVocab("word", symbols).to_bytes()})



__all__ = ["XLShape", "cluster_rows", "import_transformer_xl", "infer_shape", "map_state"]
