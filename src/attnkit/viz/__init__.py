"""Pictures drawn from values the models return: attention maps (PNG and an interactive page),
positional encodings, schedules, training curves, the softmax-scaling argument and run reports."""

from attnkit.viz.attention import AttentionView, load_views, plot_attention, plot_attention_heads
from attnkit.viz.curves import plot_curves, plot_schedule, read_metrics
from attnkit.viz.explorer import save_bertviz, write_explorer
from attnkit.viz.figure import Plot
from attnkit.viz.positions import plot_positions
from attnkit.viz.report import write_report
from attnkit.viz.softmax import plot_softmax, softmax_scaling
from attnkit.viz.stats import diagonal_stats

__all__ = [
    "AttentionView",
    "Plot",
    "diagonal_stats",
    "load_views",
    "plot_attention",
    "plot_attention_heads",
    "plot_curves",
    "plot_positions",
    "plot_schedule",
    "plot_softmax",
    "read_metrics",
    "save_bertviz",
    "softmax_scaling",
    "write_explorer",
    "write_report",
]
