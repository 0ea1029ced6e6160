"""report.html for a run folder: config, final metrics, curves and a few sample outputs with their
attention, in one self-contained file (PNGs embedded as base64, no network). Seq2seq runs show dev
translations with their cross-attention (or the translations alone for rnn-seq2seq, which has none);
language-model runs show validation snippets with their self-attention over [memory | segment] and a
greedy continuation.

Trainers call `after_fit` when they finish; it never raises, so a picture can never cost a run.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

import numpy as np

from attnkit.errors import AttnkitError
from attnkit.io import atomic_write_text

SAMPLE_FILES = (("valid.src.txt", "valid.tgt.txt"), ("test.src.txt", "test.tgt.txt"))
LM_SNIPPET = 64  # tokens of a language model's sample snippet (memory + segment)


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _metrics_table(run_dir: Path) -> tuple[str, str]:
    """(final-metrics table, curves image) from metrics.csv; empty strings when there is none."""
    from attnkit.viz.curves import read_metrics

    if not (run_dir / "metrics.csv").is_file():
        return "<p>no metrics.csv yet.</p>", ""
    log = read_metrics(run_dir)
    rows = []
    for split, cols in log.items():
        last = {k: v[-1] for k, v in cols.items() if len(v) and not np.isnan(v[-1])}
        cells = " ".join(f"<td>{html.escape(k)} {v:.4g}</td>" for k, v in last.items())
        rows.append(f"<tr><th>{html.escape(split)} (last row)</th>{cells}</tr>")
    return f'<table class="metrics">{"".join(rows)}</table>', _curves_png(run_dir)


def _curves_png(run_dir: Path) -> str:
    from attnkit.viz.curves import plot_curves
    from attnkit.viz.figure import png_bytes

    try:
        plot = plot_curves([run_dir], None, dpi=80)
    except AttnkitError as e:
        return f"<p>{html.escape(str(e))}</p>"
    return _img(png_bytes(plot.figure, 80), "training curves")


def _sample_lines(data_dir: Path | None, n: int) -> tuple[list[str], list[str]]:
    from attnkit.data import read_lines

    for src_name, tgt_name in SAMPLE_FILES:
        if data_dir is not None and (data_dir / src_name).is_file():
            refs = read_lines(data_dir / tgt_name)[:n] if (data_dir / tgt_name).is_file() else []
            return read_lines(data_dir / src_name)[:n], refs
    return [], []


def _checkpoint(run_dir: Path) -> Path | None:
    return next((p for p in (run_dir / "checkpoints" / f"{name}.safetensors" for name in ("best", "last"))
                 if p.is_file()), None)


def _samples(run_dir: Path, data_dir: Path | None, n: int) -> str:
    """A few outputs with their attention: dev translations for seq2seq runs, validation snippets for LMs."""
    from attnkit.config import family
    from attnkit.viz.attention import checkpoint_kind

    ckpt = _checkpoint(run_dir)
    if ckpt is None:
        return "<p>no checkpoint to sample.</p>"
    if family(checkpoint_kind(ckpt)).task == "lm":  # language models read text, not sentence pairs
        return _lm_samples(ckpt, data_dir, n)
    return _translation_samples(ckpt, data_dir, n)


def _translation_samples(ckpt: Path, data_dir: Path | None, n: int) -> str:
    from attnkit.config import family
    from attnkit.decode import Translator
    from attnkit.viz.attention import seq2seq_views

    sources, refs = _sample_lines(data_dir, n)
    if not sources:
        return "<p>no dev sentences to sample.</p>"
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    if not family(translator.model.kind).attention:  # rnn-seq2seq: one fixed vector, nothing to draw
        parts = [f"<p>from {html.escape(ckpt.name)}, greedy; a '{html.escape(translator.model.kind)}' model has "
                 "no attention to draw.</p>"]
        for i, (source, t) in enumerate(zip(sources, translator.translate(sources))):
            parts.append(_sample(i, source, t.text, refs[i] if i < len(refs) else None, ""))
        return "\n".join(parts)
    parts = [f"<p>from {html.escape(ckpt.name)}, greedy; attention of the last layer, heads averaged.</p>"]
    for i, view in enumerate(seq2seq_views(translator, sources)):
        parts.append(_sample(i, view.source, view.output, refs[i] if i < len(refs) else None, _attention_img(view)))
    return "\n".join(parts)


def _lm_samples(ckpt: Path, data_dir: Path | None, n: int) -> str:
    """Evenly spaced snippets of the validation text: each one's self-attention and greedy continuation."""
    from attnkit.checkpoint import load_lm_checkpoint
    from attnkit.data.lm import CORPUS_FILE, load_lm_corpus
    from attnkit.viz.attention import LM_CONTINUATION, lm_views

    if data_dir is None or not (data_dir / CORPUS_FILE).is_file():
        return "<p>no LM corpus to sample.</p>"
    splits = load_lm_corpus(data_dir).splits
    ids = next((splits[name] for name in ("valid", "test", "train") if len(splits.get(name, ())) >= 2), None)
    if ids is None:
        return "<p>no text to sample.</p>"
    model, vocab, cfg = load_lm_checkpoint(ckpt, "cpu")
    limit = getattr(cfg.model, "max_positions", LM_SNIPPET)  # an LSTM has no position table
    length = min(len(ids), LM_SNIPPET, 2 * cfg.train.tgt_len, limit)
    starts = sorted({int(s) for s in np.linspace(0, len(ids) - length, n)})
    views = lm_views(model, vocab, cfg, [ids[s : s + length].numpy() for s in starts])
    memory = (f"the first {views[0].boundary['self']} read as memory (left of the red line), the rest as the "
              "segment" if views[0].boundary else "read as one segment")
    drawn = any(views[0].maps.values())  # an LSTM LM returns no attention
    attention = "self-attention of the last layer, heads averaged" if drawn else "no attention to draw"
    parts = [f"<p>from {html.escape(ckpt.name)}: validation snippets of {length} tokens, {memory}; {attention}; "
             f"output: the greedy continuation ({LM_CONTINUATION} tokens).</p>"]
    parts += [_sample(i, view.source, view.output, None, _attention_img(view) if drawn else "")
              for i, view in enumerate(views)]
    return "\n".join(parts)


def attention_figure(view):
    """The last layer of the view's main kind (cross for seq2seq, self for LMs), heads averaged: an open figure."""
    from attnkit.viz.attention import draw_grid

    kind = "cross" if "cross" in view.maps else next(iter(view.maps))
    mean = view.maps[kind][-1].mean(0)[None, None]  # (1, 1, Tq, Tk)
    fig = draw_grid(mean, view.queries[kind], view.keys[kind], row_names=[f"{kind}, last layer"],
                    boundary=view.boundary.get(kind))
    fig.axes[0].set_title(f"{kind}, last layer, heads averaged", fontsize=8)
    return fig


def _attention_img(view) -> str:
    from attnkit.viz.figure import png_bytes

    return _img(png_bytes(attention_figure(view), 80), "attention")


def dev_attention_figure(translator, data_dir: str | Path, title: str = ""):
    """`attention_figure` of the first dev sentence (test, when there is no dev set) as `translator`'s model
    translates it now, or None when there is no sentence or the model has no attention. What the trainer
    writes into TensorBoard after every epoch, so the maps can be watched as they form."""
    from attnkit.config import family
    from attnkit.viz.attention import seq2seq_views
    from attnkit.viz.fonts import fit_fonts

    sources, _ = _sample_lines(Path(data_dir), 1)
    if not sources or not family(translator.model.kind).attention:
        return None
    view = seq2seq_views(translator, sources[:1])[0]
    fig = attention_figure(view)
    fig.suptitle(title or f"{view.source}\n→ {view.output}", fontsize=8, parse_math=False)  # text as written
    width, height = fig.get_size_inches()
    fig.set_size_inches(max(width, 6.0), max(height, 4.5) + 0.5)  # room for the two-line title
    return fit_fonts(fig)  # TensorBoard renders it without png_bytes


def _sample(i: int, source: str, output: str, ref: str | None, picture: str) -> str:
    ref_html = f"<br>reference: {html.escape(ref)}" if ref is not None else ""
    return (f"<h3>{i + 1}. {html.escape(source)}</h3><p>output: <b>{html.escape(output)}</b>{ref_html}</p>"
            f"{picture}")


def write_report(run_dir: str | Path, path: str | Path | None = None, *, data_dir: str | Path | None = None,
                 n_samples: int = 3) -> Path:
    """Write report.html for `run_dir` (default RUN/report.html); samples come from data_dir's dev set
    (a seq2seq run's prepared folder, or an LM run's `attnkit lm prepare` folder)."""
    from attnkit.viz.html import page

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise AttnkitError(f"no such run folder: {run_dir}")
    path = Path(path) if path is not None else run_dir / "report.html"
    config = (run_dir / "config.yaml").read_text(encoding="utf-8") if (run_dir / "config.yaml").is_file() else ""
    log = (run_dir / "train.log").read_text(encoding="utf-8").splitlines()[-8:] if (run_dir / "train.log").is_file() \
        else []
    metrics, curves = _metrics_table(run_dir)
    samples = _samples(run_dir, Path(data_dir) if data_dir else None, n_samples)
    body = f"""<h1>attnkit run: {html.escape(run_dir.resolve().name)}</h1>
<p>{html.escape(str(run_dir))}, report written {time.strftime('%Y-%m-%d %H:%M:%S')}</p>
<h2>final metrics</h2>{metrics}
<h2>curves</h2>{curves}
<h2>samples</h2>{samples}
<h2>log (last lines)</h2><pre>{html.escape(chr(10).join(log))}</pre>
<h2>config</h2><pre>{html.escape(config)}</pre>"""
    atomic_write_text(path, page(f"attnkit run {run_dir.name}", body))
    return path


def after_fit(run_dir: str | Path, data_dir: str | Path | None, say) -> Path | None:
    """What trainers call at the end of fit(): write report.html, or log a warning; never raise."""
    try:
        return write_report(run_dir, data_dir=data_dir)
    except Exception as e:  # a picture must never crash a finished training run
        say(f"warning: report.html not written: {type(e).__name__}: {e}")
        return None
