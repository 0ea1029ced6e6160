"""Attention heatmaps drawn from the maps a model returns: heads as columns, layers as rows.

Tq query length, Tk key length, H heads, L layers.

Every model family hands its pictures over as `AttentionView`s (one per sentence): a dict of
attention kinds, each a list over layers of (H, Tq, Tk) arrays, with the tokens that label the rows
and columns; `load_views` reads them from any checkpoint whose family (attnkit.config.FAMILIES) has
attention, so the `plot` commands, the HTML page, `--stats` and report.html work for every family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnkit.checkpoint import load_checkpoint, load_lm_checkpoint
from attnkit.config import family
from attnkit.data.batching import collate
from attnkit.data.tokenizer import BOS_ID, EOS_ID
from attnkit.decode import DecodeOptions, Ensemble, Translator
from attnkit.decode.lm import LMContext, SlidingWindow, context_rule, generate, open_context
from attnkit.errors import AttnkitError
from attnkit.viz.figure import Plot, finish, subplots

# Kinds a model returns (translation models: enc, dec, cross; RNNs: cross; LMs: self), as `--kind` names them.
KIND_NAMES = {"enc": "encoder", "dec": "decoder", "cross": "cross", "self": "self", "scores": "scores"}
TITLES = {"encoder": "encoder self-attention", "decoder": "decoder masked self-attention",
          "cross": "encoder-decoder attention", "self": "self-attention (memory | segment)",
          "scores": "hard attention: the distribution each choice was drawn from"}
LM_TITLE_NO_MEMORY = "causal self-attention"


@dataclass
class AttentionView:
    """One sentence's attention as a model returned it.

    maps: kind -> per layer (H, Tq, Tk). Translation models give "encoder", "decoder" and "cross";
    a language model gives "self" and marks the memory with `boundary`; an RNN gives "cross" (1 layer,
    1 head). queries / keys: kind -> tick labels. content: kind -> (rows, cols) that are real tokens
    (the rest are EOS/BOS), used by the statistics. note: whose maps these are where they are not one
    model's own (an ensemble's: `Ensemble.attention_note`), added to every title.
    """

    source: str
    output: str
    maps: dict[str, list[np.ndarray]]
    queries: dict[str, list[str]]
    keys: dict[str, list[str]]
    boundary: dict[str, int] = field(default_factory=dict)  # kind -> first key index after the memory
    content: dict[str, tuple[int, int]] = field(default_factory=dict)
    score: float | None = None  # a search's hypothesis: its summed log-probability
    norm_score: float | None = None  # and the score the search ranked it by
    note: str = ""
    terms: list[dict] = field(default_factory=list)  # a glossary's terms: source, target, placed, note (TermUse)

    def layers(self, kind: str) -> list[np.ndarray]:
        if kind not in self.maps:
            raise AttnkitError(f"this model has no '{kind}' attention (it has: {', '.join(self.maps)})")
        return self.maps[kind]

    def title(self, kind: str) -> str:
        """What a kind is called on the pictures (an LM's "self" without memory is plain causal attention), with
        the view's note."""
        name = LM_TITLE_NO_MEMORY if kind == "self" and kind not in self.boundary else TITLES.get(kind, kind)
        return f"{name} ({self.note})" if self.note else name


# --- drawing -------------------------------------------------------------------------------
def _panel_size(n_tokens: int) -> float:
    return min(5.0, max(2.2, 0.2 * n_tokens))


def draw_grid(weights: np.ndarray, queries: list[str], keys: list[str], *, row_names: list[str],
              boundary: int | None = None, title: str = ""):
    """weights (R, H, Tq, Tk) -> a figure with R rows x H columns of heatmaps, every axis labelled."""
    rows, heads = weights.shape[:2]
    size = _panel_size(max(len(queries), len(keys)))
    fig, axes = subplots(rows, heads, size, size)
    for r in range(rows):
        for h in range(heads):
            ax = axes[r, h]
            ax.imshow(weights[r, h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
            ax.set_title(f"{row_names[r]} head {h + 1}", fontsize=8)
            # tokens and sentences are text: "$x^$" drawn as written, never parsed as TeX math (which fails on it)
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6, parse_math=False)
            ax.set_yticks(range(len(queries)), queries, fontsize=6, parse_math=False)
            if boundary is not None:
                ax.axvline(boundary - 0.5, color="red", linewidth=1.2, linestyle="--")  # memory | segment
    if title:
        fig.suptitle(title, fontsize=10, parse_math=False)
    return fig


def plot_attention_heads(weights: torch.Tensor, query_tokens: list[str], key_tokens: list[str],
                         path: str | Path, title: str = ""):
    """weights (H, Tq, Tk) -> a row of H heatmaps saved as PNG at `path`; returns the figure."""
    w = weights.detach().float().cpu().numpy()
    cols = min(4, w.shape[0])
    rows = math.ceil(w.shape[0] / cols)
    padded = np.full((rows * cols, *w.shape[1:]), np.nan, dtype=np.float32)
    padded[: w.shape[0]] = w
    fig = draw_grid(padded.reshape(rows, cols, *w.shape[1:]), query_tokens, key_tokens,
                    row_names=[""] * rows, title=title)
    for ax in fig.axes[w.shape[0]:]:
        ax.axis("off")
    return finish(fig, {"weights": w}, path, dpi=110).figure


def select_layers(n_layers: int, layer: str | int) -> list[int]:
    """'all' -> every layer; N (1-based, negative counts from the end) -> [that layer]."""
    if layer == "all":
        return list(range(n_layers))
    try:
        n = int(layer)
    except ValueError:
        n = 0
    index = n - 1 if n > 0 else n_layers + n
    if not 0 <= index < n_layers or n == 0:
        raise AttnkitError(f"--layer {layer}: the model has layers 1..{n_layers} (or -1 for the last, or all)")
    return [index]


def plot_attention(view: AttentionView, kind: str, path: str | Path | None, layer: str | int = "all") -> Plot:
    """One kind of attention of one sentence: layers as rows, heads as columns, tokens on the axes.

    data: weights (R, H, Tq, Tk) exactly as the model returned them, layers (0-based), queries, keys.
    """
    maps = view.layers(kind)
    layers = select_layers(len(maps), layer)
    weights = np.stack([maps[i] for i in layers])  # (R, H, Tq, Tk)
    queries, keys = view.queries[kind], view.keys[kind]
    fig = draw_grid(weights, queries, keys, row_names=[f"layer {i + 1}" for i in layers],
                    boundary=view.boundary.get(kind), title=f"{view.title(kind)}: {view.source}")
    return finish(fig, {"weights": weights, "layers": layers, "queries": queries, "keys": keys}, path)


# --- model side: checkpoints -> views ---------------------------------------------------------
# Which token sequence labels the rows and the columns of each kind a seq2seq model's
# `attention(src, tgt_in)` returns: src = source + EOS, out = what each decoder position predicts
# (target + EOS), in = what the decoder reads (BOS + target).
SEQ2SEQ_SIDES = {"encoder": ("src", "src"), "decoder": ("out", "in"), "cross": ("out", "src"), "scores": ("out", "src")}


def seq2seq_views(translator, sources: list[str], targets: list[str] | None = None,
                  batch_size: int = 32) -> list[AttentionView]:
    """Every attention map of a seq2seq model (Transformer, RNN + attention) for each sentence pair.

    Without targets, each source is translated greedily first and its output teacher-forced back
    through `model.attention(src, tgt_in)`, which returns the maps: {kind: L x (B, H, T, S)} with kinds
    among "encoder", "decoder", "cross" (and an RNN's "scores"). Decoder rows are labelled with the token each
    position predicts, decoder keys with the tokens it reads.
    """
    if targets is not None and len(targets) != len(sources):
        raise AttnkitError(f"{len(sources)} source sentences but {len(targets)} targets")
    src_ids = translator.encode_sources(sources)
    if targets is None:
        tgt_ids = []
        for start in range(0, len(sources), batch_size):
            idx = list(range(start, min(start + batch_size, len(sources))))
            batch = collate([(src_ids[i], np.zeros(0, dtype=np.int64)) for i in idx], idx).to(translator.device)
            tgt_ids += [h[0].tokens for h in translator.search(batch.src, DecodeOptions())]
    else:
        tgt_ids = translator.tgt_tok.encode(targets)
    return teacher_forced_views(translator, sources, src_ids, tgt_ids, batch_size)


def translation_views(translator, sources: list[str], options: DecodeOptions, *,
                      memory_budget: int | None = None, glossary=None) -> list[list[AttentionView]]:
    """Each source's hypotheses as the translator returns them (with nbest > 1, best first), every one with the
    attention the model computes for it: its ids teacher-forced back (the same maps as step-by-step decoding).
    `memory_budget` is the translator's (bytes per search; None: half the memory available); with a `glossary`
    each view says which of its terms the hypothesis uses."""
    results = translator.translate(sources, options, memory_budget=memory_budget, glossary=glossary)
    hyps = [[t, *t.nbest] for t in results]
    flat = [(i, h) for i, hs in enumerate(hyps) for h in hs]
    src_ids = translator.encode_sources(sources)
    views = teacher_forced_views(translator, [sources[i] for i, _ in flat], [src_ids[i] for i, _ in flat],
                                 [h.tokens for _, h in flat])
    grouped: list[list[AttentionView]] = [[] for _ in sources]
    for (i, h), view in zip(flat, views):
        view.score, view.norm_score, view.terms = h.score, h.norm_score, [vars(u) for u in h.terms]
        grouped[i].append(view)
    return grouped


def teacher_forced_views(translator, sources: list[str], src_ids: list[np.ndarray], tgt_ids: list,
                         batch_size: int = 32) -> list[AttentionView]:
    """The maps of `model.attention` for each (source ids, target ids) pair, cut to length and labelled (an
    ensemble's: the members' mean, or its first member's, as its `attention_note` says)."""
    views: list[AttentionView] = []
    for start in range(0, len(sources), batch_size):
        idx = list(range(start, min(start + batch_size, len(sources))))
        targets = [np.asarray(tgt_ids[i], dtype=np.int64) for i in idx]
        batch = collate([(src_ids[i], t) for i, t in zip(idx, targets)], idx).to(translator.device)
        with torch.no_grad():
            _, maps = translator.model.attention(batch.src, batch.tgt_in)  # kind -> L x (B, H, T, S)
        maps = {k: [m.float().cpu().numpy() for m in layers] for k, layers in maps.items()
                if k in SEQ2SEQ_SIDES and layers and all(m is not None for m in layers)}
        if not maps:
            raise AttnkitError(f"a '{translator.model.kind}' model returns no attention to draw")
        views += [_seq2seq_view(translator, maps, j, sources[i], src_ids[i], t) for j, (i, t) in
                  enumerate(zip(idx, targets))]
    return views


def _seq2seq_view(translator, maps: dict[str, list[np.ndarray]], row: int, source: str, src_ids: np.ndarray,
                  tgt_ids: np.ndarray) -> AttentionView:
    """Row `row` of a batch of maps, cut to its real length and labelled with its tokens."""
    tokens = {"src": translator.src_tok.pieces([*src_ids.tolist(), EOS_ID]),
              "out": translator.tgt_tok.pieces([*tgt_ids.tolist(), EOS_ID]),
              "in": translator.tgt_tok.pieces([BOS_ID, *tgt_ids.tolist()])}
    sides = {kind: SEQ2SEQ_SIDES[kind] for kind in maps}
    return AttentionView(
        source=source, output=translator.tgt_tok.decode([tgt_ids.tolist()])[0],
        maps={k: [m[row, :, : len(tokens[q]), : len(tokens[c])] for m in maps[k]] for k, (q, c) in sides.items()},
        queries={k: tokens[q] for k, (q, _) in sides.items()},
        keys={k: tokens[c] for k, (_, c) in sides.items()},
        content={k: (len(tokens[q]) - 1, len(tokens[c]) - 1) for k, (q, c) in sides.items()},  # no EOS / BOS
        note=translator.model.attention_note if isinstance(translator.model, Ensemble) else "")


def seq2seq_loader(checkpoints: list[str | Path], sources: list[str], targets: list[str] | None,
                   device: str) -> list[AttentionView]:
    return seq2seq_views(Translator.from_checkpoints(checkpoints, device=device), sources, targets)


# --- model side: language models -> views ----------------------------------------------------
LM_CONTINUATION = 24  # tokens of greedy continuation shown as an LM view's output
VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\\t"}  # whitespace tokens as tick labels: ␣ ↵ \t


def lm_token_labels(vocab, ids) -> list[str]:
    """Tick labels of LM ids: the vocabulary's tokens (characters, words or subword pieces), whitespace visible."""
    if vocab.subword is not None:
        return vocab.subword.pieces([int(i) for i in ids])
    return [VISIBLE.get(tok, tok) for tok in (vocab.tokens[int(i)] for i in ids)]


def lm_encode(vocab, text: str) -> np.ndarray:
    """A text as the LM's ids, without the end-of-line token the vocabulary adds after every line."""
    ids = vocab.encode([text])[:-1]
    if not len(ids):
        raise AttnkitError("the text is empty: a language model needs some text to read")  # CLI and service alike
    return ids


def memory_split(model, context: LMContext, n_tokens: int, mem_len: int | None) -> int:
    """Where the segment drawn starts in an n-token text: the tokens before it are read into memory (or, without
    memory, lie outside the window), by the rule the model samples with (attnkit.decode.lm.context_rule).

    Transformer-XL (and the recurrent vanilla LM): the first half by default, or `mem_len` tokens, but never a
    segment longer than the rule's (positions the model never learned); without memory (the vanilla LM, a model
    trained without it) the window, the last `segment` tokens; an LSTM reads its state through the whole text.
    """
    segment = context.rule.segment
    if isinstance(context, SlidingWindow):
        if mem_len:
            raise AttnkitError(f"--mem-len {mem_len}: this {model.kind} model reads with no memory (one window: the "
                               f"text's last {segment} tokens at most)")
        return max(0, n_tokens - segment)
    if not model.attends_to_memory:
        if mem_len:
            raise AttnkitError(f"--mem-len {mem_len}: a {model.kind} model has no memory of positions (it reads the "
                               "text as one stream)")
        return 0
    if mem_len is None:
        return max(n_tokens // 2, n_tokens - segment)
    if not 0 <= mem_len < n_tokens:
        raise AttnkitError(f"--mem-len {mem_len}: the text has {n_tokens} tokens; the memory takes 0..{n_tokens - 1} "
                           "of them and leaves the rest to the segment")
    if n_tokens - mem_len > segment:
        raise AttnkitError(f"--mem-len {mem_len}: the segment would be {n_tokens - mem_len} tokens; this "
                           f"{model.kind} reads at most {segment} at once: give --mem-len {n_tokens - segment} or more")
    return mem_len


def read_view(model, context: LMContext, x: torch.Tensor, m: int) -> tuple[list[np.ndarray], int]:
    """x (1, N) read by `context`: ids[:m] into memory, then ids[m:] as the segment drawn -> its self-attention
    L x (H, N - m, M' + N - m) as the model returns it, and M' the memory keys it attends to."""
    with torch.no_grad():
        if m and model.attends_to_memory:
            context.feed(x[:, :m])
            context.commit()  # the recurrent vanilla LM: its segment in progress becomes memory
        context.feed(x[:, m:], need_weights=True)
    maps = [w[0].float().cpu().numpy() for w in context.weights]  # L x (H, Tq, Tk)
    return maps, (maps[0].shape[-1] - maps[0].shape[-2] if maps else 0)


def lm_views(model, vocab, cfg, texts: list[np.ndarray], mem_len: int | None = None, *,
             continuation: int = LM_CONTINUATION) -> list[AttentionView]:
    """The self-attention of a language model over each text of ids (N,), read by the rule it samples with.

    The first m ids are read into memory (`memory_split`: pieces of at most the rule's segment, the memory it
    carries), the remaining ids are the segment drawn: its queries over [memory | segment], `weights`
    L x (1, H, T, M + T) from `need_weights=True`. A model without memory draws its window, the last ids. The
    output is the model's greedy continuation of the whole text, read by the same rule.
    """
    device = next(model.parameters()).device
    rule = context_rule(model.kind, cfg)
    views = []
    for ids in texts:
        n = len(ids)
        context = open_context(model, rule)
        m = memory_split(model, context, n, mem_len)
        x = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=device)[None]  # (1, N)
        maps, memory = read_view(model, context, x, m)
        labels = lm_token_labels(vocab, ids)
        output = ""
        if continuation > 0:
            generator = torch.Generator(device=device).manual_seed(0)  # temperature 0: the arg-max, not a draw
            new = generate(model, x, continuation, rule, temperature=0.0, generator=generator)
            output = vocab.decode(new[0].tolist())
        views.append(AttentionView(
            source=vocab.decode([int(i) for i in ids]), output=output,
            maps={"self": maps}, queries={"self": labels[m:]}, keys={"self": labels[m - memory:]},
            boundary={"self": memory} if memory else {}, content={"self": (n - m, n - m + memory)}))
    return views


def lm_loader(checkpoint: str | Path, sources: list[str], targets: list[str] | None, device: str,
              mem_len: int | None = None) -> list[AttentionView]:
    if targets is not None:
        raise AttnkitError("a language model reads one text: give --src (or --src-file) without --tgt")
    model, vocab, cfg = load_lm_checkpoint(checkpoint, device)
    return lm_views(model, vocab, cfg, [lm_encode(vocab, text) for text in sources], mem_len)


def checkpoint_kind(checkpoint: str | Path) -> str:
    return load_checkpoint(checkpoint).kind


def load_views(checkpoint: str | Path | list[str | Path], sources: list[str], targets: list[str] | None = None,
               device: str = "cpu", *, mem_len: int | None = None) -> list[AttentionView]:
    """The attention views of any model kind that returns its maps, read from its checkpoint: language
    models read each source as one text (`mem_len`: how many of its tokens become the memory), seq2seq
    models translate each source (or read the given target) and return every map. Several translation
    checkpoints are one ensemble (`Translator.from_checkpoints`), drawn with its attention (`Ensemble`)."""
    paths = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
    kind = checkpoint_kind(paths[0])
    fam = family(kind, f"{paths[0]}: model kind")
    if not fam.attention:
        how = "its context is a recurrent state" if fam.task == "lm" else "it reads the source through one fixed vector"
        raise AttnkitError(f"a '{kind}' model has no attention to draw ({how})")
    if fam.task == "lm":
        if len(paths) > 1:
            raise AttnkitError(f"{paths[0]} holds a '{kind}' language model: draw one at a time (ensembles are of "
                               "translation models)")
        return lm_loader(paths[0], sources, targets, device, mem_len)
    if mem_len is not None:
        raise AttnkitError(f"--mem-len is for language models; a '{kind}' model has no memory")
    return seq2seq_loader(paths, sources, targets, device)
