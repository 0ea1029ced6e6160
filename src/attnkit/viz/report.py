"""report.html for a run folder: config, final metrics, curves and a few sample outputs with their
attention, in one self-contained file (PNGs embedded as base64, no network).

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


def _samples(run_dir: Path, data_dir: Path | None, n: int) -> str:
    from attnkit.viz.attention import draw_grid, load_views
    from attnkit.viz.figure import png_bytes

    ckpt = next((p for p in (run_dir / "checkpoints" / f"{name}.safetensors" for name in ("best", "last"))
                 if p.is_file()), None)
    sources, refs = _sample_lines(data_dir, n)
    if ckpt is None or not sources:
        return "<p>no checkpoint or no dev sentences to sample.</p>"
    parts = [f"<p>from {html.escape(ckpt.name)}, greedy; attention of the last layer, heads averaged.</p>"]
    for i, view in enumerate(load_views(ckpt, sources, device="cpu")):
        kind = "cross" if "cross" in view.maps else next(iter(view.maps))
        mean = view.maps[kind][-1].mean(0)[None, None]  # (1, 1, Tq, Tk)
        fig = draw_grid(mean, view.queries[kind], view.keys[kind], row_names=[f"{kind}, last layer"],
                        boundary=view.boundary.get(kind))
        ref = f"<br>reference: {html.escape(refs[i])}" if i < len(refs) else ""
        parts.append(f"<h3>{i + 1}. {html.escape(view.source)}</h3><p>output: <b>{html.escape(view.output)}</b>"
                     f"{ref}</p>{_img(png_bytes(fig, 80), 'attention')}")
    return "\n".join(parts)


def write_report(run_dir: str | Path, path: str | Path | None = None, *, data_dir: str | Path | None = None,
                 n_samples: int = 3) -> Path:
    """Write report.html for `run_dir` (default RUN/report.html); samples come from data_dir's dev set."""
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
