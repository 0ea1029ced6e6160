"""Scores: sacreBLEU (cased and lowercased), chrF and exact match."""

from attnkit.eval.bleu import Scores, exact_match, score_corpus

__all__ = ["Scores", "exact_match", "score_corpus"]
