"""Pictures drawn from values the models return."""

from attnkit.viz.attention import plot_attention_heads

__all__ = ["plot_attention_heads"]
