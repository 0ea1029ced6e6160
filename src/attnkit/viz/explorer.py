"""The attention explorer: one self-contained page (no network) for every family's attention, and bertviz's input.

The page has four views of the same arrays (assets/explorer.js): bertviz's head view (a line from each query token to
each key token it attends to, one colour per head), its model view (every layer x head as a thumbnail; a click
enlarges one), a heatmap per layer and head (or their mean), and per-token summaries (each head's arg-max key and the
entropy of its weights). Transformer-XL's keys are [memory | segment] with the boundary marked; an RNN shows its soft
alignment, or its hard choices and the distribution they were drawn from; a beam search shows each n-best entry.

The same page is written by `attnkit plot attention --html` (the data embedded) and served at `/` by `attnkit serve`
(the data fetched from POST /explore as the user types).

Data: {"title", "model", "task": "translation" | "lm", "items": [{"source", "hypotheses": [{"text", "score",
"norm_score", "terms": [{"source", "target", "placed", "note"}], "kinds": {kind: {"title", "queries", "keys",
"boundary", "layers": L x H x Tq x Tk}}}]}]}.
"""

from __future__ import annotations

import html
import io
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnkit.errors import AttnkitError
from attnkit.io import atomic_write_bytes, atomic_write_text
from attnkit.viz.attention import AttentionView
from attnkit.viz.html import embed_json

DIGITS = 4  # weights are embedded rounded to this many decimals


def _asset(name: str) -> str:
    return resources.files("attnkit.viz").joinpath("assets", name).read_text(encoding="utf-8")


def kinds_json(view: AttentionView, digits: int = DIGITS) -> dict[str, Any]:
    """One hypothesis' maps: per kind its title, token labels, memory boundary and layers x heads x rows x cols."""
    return {kind: {"title": view.title(kind), "queries": view.queries[kind], "keys": view.keys[kind],
                   "boundary": view.boundary.get(kind), "layers": [m.round(digits).tolist() for m in layers]}
            for kind, layers in view.maps.items()}


def explorer_data(items: list[list[AttentionView]], *, title: str, model: str, task: str) -> dict[str, Any]:
    """The page's JSON: `items` holds, per input, its hypotheses (one, or a beam's n-best, best first)."""
    return {"title": title, "model": model, "task": task, "items": [{
        "source": hyps[0].source,
        "hypotheses": [{"text": v.output, "score": v.score, "norm_score": v.norm_score, "terms": v.terms,
                        "kinds": kinds_json(v)} for v in hyps]} for hyps in items]}


def explorer_page(title: str, data: dict[str, Any] | None = None, live: dict[str, Any] | None = None) -> str:
    """The whole page: the data embedded (a file), or `live` settings for the form that asks the server for it."""
    body = _asset("explorer.html").replace("{{title}}", html.escape(title))
    embedded = embed_json("explorer-data", data) if data is not None else ""
    settings = embed_json("explorer-live", live) if live is not None else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{_asset('explorer.css')}</style>\n</head>\n<body>\n{body}\n{embedded}\n{settings}\n"
            f"<script>{_asset('explorer.js')}</script>\n</body>\n</html>\n")


def write_explorer(items: list[list[AttentionView]], path: str | Path, *, title: str, model: str,
                   task: str) -> dict[str, Any]:
    """Write the explorer page for `items` at `path` (atomically); returns the data it embeds."""
    data = explorer_data(items, title=title, model=model, task=task)
    atomic_write_text(path, explorer_page(title, data))
    return data


# --- bertviz ------------------------------------------------------------------------------------------------------
def bertviz_inputs(view: AttentionView) -> dict[str, Any]:
    """One view as the keyword arguments of bertviz's `head_view` / `model_view`: per layer a (1, H, q, k) tensor
    and the tokens. A translation model gives encoder_attention / decoder_attention / cross_attention with
    encoder_tokens (the source) and decoder_tokens (the decoder's inputs, BOS first); a language model gives
    `attention` over all its tokens, square: with a memory, the memory's rows are zero (only the segment queries);
    an RNN gives its cross attention (the hard choices for rnn-hard)."""
    def stack(kind: str) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(np.ascontiguousarray(m, dtype=np.float32))[None] for m in view.maps[kind])

    if "self" in view.maps:
        keys, m = view.keys["self"], view.boundary.get("self", 0)
        square = []
        for layer in stack("self"):  # (1, H, T, M + T) -> (1, H, M + T, M + T)
            full = layer.new_zeros(1, layer.size(1), len(keys), len(keys))
            full[:, :, m:] = layer
            square.append(full)
        return {"attention": tuple(square), "tokens": list(keys)}
    out: dict[str, Any] = {}
    names = {"encoder": "encoder_attention", "decoder": "decoder_attention", "cross": "cross_attention"}
    for kind, name in names.items():
        if kind in view.maps:
            out[name] = stack(kind)
    if "cross" in view.maps:
        out["encoder_tokens"] = list(view.keys["cross"])
    elif "encoder" in view.maps:
        out["encoder_tokens"] = list(view.keys["encoder"])
    inputs = view.keys["decoder"] if "decoder" in view.maps else ["<s>", *view.queries["cross"][:-1]]  # BOS + output
    out["decoder_tokens"] = list(inputs)
    return out


def save_bertviz(views: list[AttentionView], path: str | Path) -> list[Path]:
    """One file per view (bertviz draws one sentence): `path` itself for one view, else path-1, path-2, ...; open one
    with `head_view(**torch.load(file))`. Written atomically; returns the files."""
    if not views:
        raise AttnkitError("no attention to export")
    path = Path(path)
    paths = [path] if len(views) == 1 else [path.with_name(f"{path.stem}-{i + 1}{path.suffix}")
                                            for i in range(len(views))]
    for view, target in zip(views, paths):
        buffer = io.BytesIO()
        torch.save(bertviz_inputs(view), buffer)
        atomic_write_bytes(target, buffer.getvalue())
    return paths
