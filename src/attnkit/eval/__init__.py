"""Scores: sacreBLEU (cased and lowercased), chrF and exact match; a translated test set's scores."""

from attnkit.eval.bleu import Scores, exact_match, score_corpus
from attnkit.eval.translation import translate_and_score

__all__ = ["Scores", "exact_match", "score_corpus", "translate_and_score"]
