"""fairseq's Transformer translation models imported as attnkit checkpoints: a checkpoint of `fairseq-train --arch
transformer*` (checkpoint_best.pt, or a released model.pt), its dictionaries (dict.SRC.txt, dict.TGT.txt) and the
pipeline its text was split with: a sentencepiece model, or Moses + subword-nmt BPE codes
(attnkit.formats.fairseq_text). docs/import.md has the mapping table.

V vocabulary, D model dim, P positions.

fairseq's `transformer` is attnkit's Transformer (post-LN, or pre-LN with a final LayerNorm per stack; embeddings
scaled by sqrt(D); queries scaled by 1/sqrt(head dim)); four things are laid out differently, each mapped exactly:

- Names: the layers' are `layer_names`' (q, k, v packed into attnkit's in_proj); a pre-LN model's final LayerNorms
  `encoder.layer_norm` / `decoder.layer_norm` are attnkit's `encoder_norm` / `decoder_norm`.
- Positions: fairseq numbers a sentence's tokens from padding_idx + 1 (2, with pad 1) and gives padding row
  padding_idx; its sinusoid puts the sines before the cosines, at frequencies 10000^(-i / (D/2 - 1)) where
  attnkit's are 10000^(-2i / D). No attnkit sinusoid is that one, so the import stores the P rows fairseq reads
  (`positions: learned`, row p = fairseq's row padding_idx + 1 + p), for sinusoidal and learned positions alike.
  Fine-tuned in attnkit, that table would train.
- Ids: fairseq's dictionary is <s> 0, <pad> 1, </s> 2, <unk> 3, then dict.txt's symbols in order; its decoder
  starts from </s>. attnkit's rows (`Side`, as for Marian): PAD, BOS = a copy of </s> (the row decoding starts
  from, NEVER added to its logit), EOS, UNK, then fairseq's other ids in order (<s> among them: it takes
  probability in fairseq's softmax, so it does here), then one row per piece the sentencepiece model produces that
  the dictionary lacks (a copy of <unk>, as fairseq reads it; NEVER). So a score is fairseq's log-probability.
  With BPE codes every piece the dictionary lacks is UNK itself (the codes make any piece; no table lists them).
- Settings: heads, activation, embedding scale and dropouts come from the checkpoint's settings (`args`, or
  `cfg.model`), sizes from the tensors' shapes; what attnkit's Transformer cannot express (a LayerNorm on the
  embeddings, different encoder and decoder widths or position tables, adaptive softmax, cross-self-attention,
  the tanh GELU) is refused in one line naming it.
- LayerNorm placement: each stack's from encoder_normalize_before / decoder_normalize_before, or, in a checkpoint
  stripped of them, from the final LayerNorm the stack's weights hold or lack (fairseq builds one for a pre-LN
  stack alone). attnkit's Transformer has one placement for both stacks, each pre-LN one ending with a LayerNorm,
  so stacks placed differently, and a pre-LN decoder without its final LayerNorm (no_decoder_final_norm), are
  refused in one line naming the setting, as are settings contradicting the weights (`_norm_first`).

A fairseq checkpoint pickles argparse.Namespace and fairseq's own classes beside its tensors, so it is read only when
trusted (`--trust-checkpoint`), and then with every class it names inert (`inert_pickle.torch_load`): nothing runs,
and fairseq need not be installed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from attnkit.checkpoint import Checkpoint, require_trust
from attnkit.config import RunConfig, TrainConfig, TransformerConfig
from attnkit.data.tokenizer_kinds import tokenizer_from_bytes
from attnkit.errors import AttnkitError, CheckpointError, DataError
from attnkit.formats.fairseq_text import SPECIALS, dictionaries, read_dictionary, text_pipeline
from attnkit.formats.folder import Weights
from attnkit.formats.inert_pickle import state_of, torch_load
from attnkit.formats.layer_names import layer_table, model_shapes
from attnkit.formats.marian_vocab import NEVER, Side

CHECKPOINTS = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")  # what a folder's checkpoint is called
PAD = 1  # fairseq's padding_idx, from which its positions count
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # fairseq's gelu is F.gelu (erf)
LAYER_NORM_EPS = 1e-5  # fairseq's LayerNorm is torch's, of the default epsilon


def checkpoint_file(source: Path) -> Path:
    """The checkpoint a SOURCE names: the file itself, or the first of CHECKPOINTS in the folder."""
    if source.is_file():
        return source
    if not source.is_dir():
        raise CheckpointError(f"no such file or folder: {source}")
    found = next((source / n for n in CHECKPOINTS if (source / n).is_file()), None)
    if found is None:
        raise CheckpointError(f"{source}: no fairseq checkpoint ({', '.join(CHECKPOINTS)})")
    return found


def read_checkpoint(path: Path) -> dict:
    """The checkpoint's top-level dict (model, args / cfg, ...), every class it names inert."""
    require_trust(path, "reads a fairseq checkpoint (a pickle) only then, and runs nothing it names even so")
    try:
        obj = torch_load(path)
    except Exception as e:  # noqa: BLE001 - anything unpickling raises is this file's fault
        raise CheckpointError(f"{path}: not a readable torch.save file (truncated or corrupt?): "
                              f"{' '.join(str(e).split())[:300]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise CheckpointError(f"{path}: not a fairseq checkpoint (a dict whose 'model' holds the weights)")
    return obj


def settings(ckpt: dict, path: Path) -> tuple[dict, dict]:
    """(the model's settings, the task's): fairseq >= 0.10 keeps them in cfg.model and cfg.task (a dict, or an
    argparse.Namespace), older checkpoints in one Namespace, `args`."""
    cfg = state_of(ckpt.get("cfg"))
    model, task = state_of(cfg.get("model")), state_of(cfg.get("task"))
    if not model:  # the older layout: one Namespace for everything
        model = task = state_of(ckpt.get("args"))
    if not model:
        raise CheckpointError(f"{path}: no model settings (neither cfg.model nor args): not a fairseq checkpoint?")
    return model, task


def arg(s: dict, name: str, tp: type, default: Any, path: Path) -> Any:
    """setting `name` of type `tp` (default where absent or None), or a one-line error naming it."""
    value = s.get(name)
    if value is None:
        return default
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise CheckpointError(f"{path}: the model's setting '{name}' is {value!r}, not a {tp.__name__}")
    return value


def fairseq_sinusoid(rows: int, d_model: int) -> torch.Tensor:
    """(rows, D): fairseq's SinusoidalPositionalEmbedding.get_embedding without its padding row zeroed: sines in
    channels [0, D/2), cosines in [D/2, D), frequency i = 10000^(-i / (D/2 - 1)), a zero channel last if D is odd."""
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))  # (D/2,)
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * freq[None]  # (rows, D/2)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return torch.cat([table, torch.zeros(rows, d_model % 2)], dim=1)


def _refusal(w: Weights, s: dict) -> str | None:
    """What attnkit's Transformer cannot express, in words naming it; None where everything maps."""
    reasons = [
        (w.has("encoder.layernorm_embedding.weight") or w.has("decoder.layernorm_embedding.weight"),
         "a LayerNorm on the embeddings (layernorm_embedding)"),
        (bool(s.get("adaptive_softmax_cutoff")), "an adaptive softmax (adaptive_softmax_cutoff)"),
        (bool(s.get("cross_self_attention")), "cross-self-attention (cross_self_attention)"),
        (bool(s.get("no_cross_attention")), "a decoder without cross-attention (no_cross_attention)"),
        (w.has("decoder.project_in_dim.weight") or w.has("decoder.project_out_dim.weight"),
         "a decoder whose input or output width differs from its layers' (decoder_input_dim, decoder_output_dim)"),
        (s.get("activation_fn", "relu") not in ACTIVATIONS,
         f"the activation {s.get('activation_fn')!r} (activation_fn; attnkit has {', '.join(ACTIVATIONS)})"),
        (w.has("encoder.embed_positions.weight") != w.has("decoder.embed_positions.weight"),
         "learned positions on one side and sinusoids on the other"),
    ]
    return next((why for bad, why in reasons if bad), None)


def _heads(s: dict, path: Path) -> int:
    enc, dec = (arg(s, f"{side}_attention_heads", int, 8, path) for side in ("encoder", "decoder"))
    if enc != dec:
        raise CheckpointError(f"{path}: encoder_attention_heads {enc} and decoder_attention_heads {dec} differ; "
                              "attnkit's Transformer has one number of heads")
    return enc


def _layers(w: Weights, side: str) -> int:
    n = 0
    while w.has(f"{side}.layers.{n}.fc1.weight"):
        n += 1
    if n == 0:
        raise CheckpointError(f"{w.path}: no tensor '{side}.layers.0.fc1.weight' (not a fairseq Transformer?)")
    return n


def _positions(w: Weights, rows: int, d_model: int) -> torch.Tensor:
    """(P, D): the rows fairseq adds at positions 0 .. P-1, its learned table's or its sinusoid's."""
    if not w.has("encoder.embed_positions.weight"):
        return fairseq_sinusoid(PAD + 1 + rows, d_model)[PAD + 1:]
    shape = tuple(w.tensors["encoder.embed_positions.weight"].shape)
    enc, dec = (w.get(f"{side}.embed_positions.weight", shape) for side in ("encoder", "decoder"))
    if not torch.equal(enc, dec):
        raise CheckpointError(f"{w.path}: the encoder's and the decoder's learned positions differ; attnkit's "
                              "Transformer has one position table")
    return enc[PAD + 1: PAD + 1 + rows]


def _placements(w: Weights, s: dict, path: Path) -> dict[str, tuple[bool, str]]:
    """Each stack's LayerNorm placement as trained, {encoder|decoder: (pre-LN?, where it was read, in words)}: the
    setting `{side}_normalize_before`, else (a checkpoint stripped of it) whether the stack ends with a LayerNorm,
    `{side}.layer_norm.*`, which fairseq builds for a pre-LN stack alone. Both sides are read the same way, so a
    mixed stack is seen as one whichever way it was saved (test_a_stripped_mixed_placement_is_refused_by_its_weights,
    test_a_stripped_uniform_placement_scores_as_fairseq)."""
    out = {}
    for side in ("encoder", "decoder"):
        name = f"{side}_normalize_before"
        if s.get(name) is not None:
            pre = arg(s, name, bool, False, path)
            out[side] = (pre, f"{name}={pre}")
        else:
            pre = w.has(f"{side}.layer_norm.weight")
            out[side] = (pre, f"the {side} {'ends with' if pre else 'lacks'} a final LayerNorm ({side}.layer_norm: "
                              f"{'pre' if pre else 'post'}-LN)")
    return out


def _norm_first(w: Weights, s: dict, path: Path) -> bool:
    """attnkit's `norm_first`: one placement for both stacks, each pre-LN stack ending with a LayerNorm
    (attnkit.models.transformer). So a checkpoint whose stacks differ, or whose pre-LN decoder has no final LayerNorm
    (no_decoder_final_norm), is refused in one line naming the setting rather than imported as another network; and
    settings that contradict the final LayerNorms the weights hold are refused too
    (test_a_mixed_placement_is_refused_in_one_line, test_settings_that_contradict_the_weights_are_refused)."""
    (enc, enc_words), (dec, dec_words) = _placements(w, s, path).values()
    if enc != dec:
        raise CheckpointError(f"{path}: {enc_words} but {dec_words}; attnkit's Transformer uses one placement for "
                              "both stacks")
    if dec and arg(s, "no_decoder_final_norm", bool, False, path):
        raise CheckpointError(f"{path}: a pre-LN decoder without its final LayerNorm (no_decoder_final_norm=True); "
                              "attnkit's pre-LN Transformer ends each stack with one")
    held = [f"{side}.layer_norm.weight" for side in ("encoder", "decoder") if w.has(f"{side}.layer_norm.weight")]
    if held and not enc:
        raise CheckpointError(f"{path}: post-LN by its settings ({enc_words}, {dec_words}), yet it holds {held[0]}, "
                              "a pre-LN stack's final LayerNorm; its settings and weights disagree")
    return enc


def _model_config(w: Weights, s: dict, sides: dict[str, Side], share: bool, scaled: bool, output: torch.Tensor,
                  path: Path) -> TransformerConfig:
    d_model = tuple(w.tensors["encoder.embed_tokens.weight"].shape)[1]
    heads = _heads(s, path)
    if d_model % heads:
        raise CheckpointError(f"{path}: the width {d_model} does not split into {heads} heads")
    p = min(arg(s, "max_source_positions", int, 1024, path), arg(s, "max_target_positions", int, 1024, path))
    if w.has("encoder.embed_positions.weight"):  # a learned table holds what it holds
        p = min(p, w.tensors["encoder.embed_positions.weight"].shape[0] - PAD - 1)
    untied = not torch.equal(output, w.tensors["decoder.embed_tokens.weight"].float())
    positions = "none" if arg(s, "no_token_positional_embeddings", bool, False, path) else "learned"
    return TransformerConfig(
        src_vocab_size=len(sides["src"].ids), tgt_vocab_size=len(sides["tgt"].ids), d_model=d_model, n_heads=heads,
        d_ff=tuple(w.tensors["encoder.layers.0.fc1.weight"].shape)[0], n_encoder_layers=_layers(w, "encoder"),
        n_decoder_layers=_layers(w, "decoder"), dropout=arg(s, "dropout", float, 0.1, path),
        attention_dropout=arg(s, "attention_dropout", float, 0.0, path),
        activation_dropout=arg(s, "activation_dropout", float, arg(s, "relu_dropout", float, 0.0, path), path),
        activation=ACTIVATIONS[s.get("activation_fn") or "relu"],
        norm_first=_norm_first(w, s, path), share_embeddings=share, tie_output=scaled and not untied,
        output_bias=True, max_positions=p, positions=positions)


def _output(w: Weights) -> torch.Tensor:
    """The decoder's output word vectors (V, D): output_projection (fairseq >= 0.10), embed_out (older, untied), or
    the decoder's embedding (older, tied)."""
    names = ("decoder.output_projection.weight", "decoder.embed_out", "decoder.embed_tokens.weight")
    return w.tensors[next(n for n in names if w.has(n))].float()


def _state(w: Weights, config: TransformerConfig, sides: dict[str, Side], rows: dict[str, int], scaled: bool,
           output: torch.Tensor) -> dict[str, torch.Tensor]:
    """attnkit's state dict: the layers by `layer_table`, the vocabulary tensors in attnkit's rows (unscaled tables
    divided by sqrt(D), as attnkit scales every embedding), the position rows, the NEVER bias."""
    c, shapes = config, model_shapes(config)
    state = {}
    for name, theirs, _ in layer_table(c.n_encoder_layers, c.n_decoder_layers):
        part = (shapes[name][0] // len(theirs), *shapes[name][1:])
        state[name] = torch.cat([w.get(n, part) for n in theirs])
    if c.norm_first:
        state.update({f"{side}_norm.{p}": w.get(f"{side}.layer_norm.{p}", (c.d_model,))
                      for side in ("encoder", "decoder") for p in ("weight", "bias")})
    same = torch.arange(c.d_model)  # fairseq's channels are attnkit's
    tables = {side: w.get(f"{name}.embed_tokens.weight", (rows[side], c.d_model))
              for side, name in (("src", "encoder"), ("tgt", "decoder"))}
    scale = 1.0 if scaled else 1 / math.sqrt(c.d_model)
    state["src_embed.weight"] = sides["src"].table(tables["src"], same) * scale
    if not c.share_embeddings:
        state["own_tgt_embed.weight"] = sides["tgt"].table(tables["tgt"], same) * scale
    if not c.tie_output:
        state["out_proj.weight"] = sides["tgt"].table(output, same)
    if c.positions == "learned":
        state["positions.table"] = _positions(w, c.max_positions, c.d_model)
    state["out_bias"] = torch.zeros(c.tgt_vocab_size)
    state["out_bias"][sides["tgt"].never] = NEVER
    return state


def import_fairseq(source: str | os.PathLike, *, vocab: str | os.PathLike | None = None,
                   spm: str | os.PathLike | None = None, bpe_codes: str | os.PathLike | None = None,
                   moses: bool | None = None, src_lang: str | None = None,
                   tgt_lang: str | None = None) -> Checkpoint:
    """An attnkit checkpoint (kind transformer, tokenizers inside) of a fairseq Transformer checkpoint (a file, or a
    folder holding model.pt / checkpoint_best.pt), read only when trusted. The dictionaries dict.SRC.txt and
    dict.TGT.txt come from `vocab` (a folder: the data-bin fairseq-preprocess wrote), the checkpoint's folder or the
    training's data folder (cfg.task.data); the text pipeline (attnkit.formats.fairseq_text) from `spm` (a
    sentencepiece model) or `bpe_codes` (subword-nmt's, after Moses unless `moses` is False), else as the
    checkpoint names it or what lies beside it. The languages are recorded as given, else as the checkpoint's task
    names them (unless those are src / tgt); Moses splits each side by its language's rules."""
    path = checkpoint_file(Path(source))
    ckpt = read_checkpoint(path)
    s, task = settings(ckpt, path)
    w = Weights({k: v for k, v in ckpt["model"].items() if torch.is_tensor(v)}, path,
                kind="a fairseq Transformer", sizes="its dictionaries and settings")
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "encoder.layers.0.fc1.weight"):
        if not w.has(name):
            raise CheckpointError(f"{path}: no tensor '{name}' (not a fairseq Transformer?)")
    why = _refusal(w, s)
    if why:
        raise CheckpointError(f"{path} holds {why}; attnkit's Transformer cannot express it")
    langs = (arg(task, "source_lang", str, "src", path), arg(task, "target_lang", str, "tgt", path))
    data = str(task.get("data") or "").split(os.pathsep)[0]
    folders = [Path(vocab)] if vocab is not None else [path.parent] + ([Path(data)] if data else [])
    dicts = dictionaries(folders, langs, path)
    recorded = {"src": src_lang or langs[0], "tgt": tgt_lang or langs[1]}
    text = text_pipeline(ckpt, path, spm=None if spm is None else Path(spm),
                         codes=None if bpe_codes is None else Path(bpe_codes), moses=moses,
                         langs=(recorded["src"], recorded["tgt"]))
    specials = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}
    eos = SPECIALS.index("</s>")  # fairseq's decoder starts from </s>
    rows = {side: w.tensors[f"{name}.embed_tokens.weight"].shape[0] for side, name in (("src", "encoder"),
                                                                                        ("tgt", "decoder"))}
    for (side, n), d in zip(rows.items(), dicts):
        if n != len(d.pieces):
            raise CheckpointError(f"{d.path}: {len(d.pieces):,} symbols (with fairseq's 4 specials) for the "
                                  f"{'encoder' if side == 'src' else 'decoder'}'s {n:,} embedding rows")
    sides = {side: Side.of(d, rows[side], specials, eos, text.spms) for side, d in zip(("src", "tgt"), dicts)}
    share = dicts[0].pieces == dicts[1].pieces and torch.equal(w.tensors["encoder.embed_tokens.weight"],
                                                               w.tensors["decoder.embed_tokens.weight"])
    scaled, output = not arg(s, "no_scale_embedding", bool, False, path), _output(w)
    config = _model_config(w, s, sides, share, scaled, output, path)
    state = _state(w, config, sides, rows, scaled, output)
    if {k: tuple(v.shape) for k, v in state.items()} != model_shapes(config):
        raise AttnkitError(f"import of {path}: the weights mapped do not make attnkit's model (a bug in attnkit)")
    tokenizers = {side: text.tokenizer(side, sides[side].names) for side in ("src", "tgt")}
    try:
        for blob in tokenizers.values():
            tokenizer_from_bytes(blob)
    except DataError as e:
        raise CheckpointError(f"{text.source}: {e}") from None
    if tokenizers["src"] == tokenizers["tgt"]:
        del tokenizers["tgt"]
    return Checkpoint(kind="transformer", config=RunConfig(model=config, train=TrainConfig()), model_state=state,
                      tokenizers=tokenizers, languages={k: v for k, v in recorded.items() if v not in ("src", "tgt")})


__all__ = ["fairseq_sinusoid", "import_fairseq", "read_dictionary"]
