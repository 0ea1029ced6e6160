"""Scores: sacreBLEU (cased and lowercased, tokenised for the target language), chrF and exact match; a translated
test set's scores."""

from attnkit.eval.bleu import Scores, TokenizerChoice, bleu_tokenizer, exact_match, score_corpus
from attnkit.eval.translation import translate_and_score

__all__ = ["Scores", "TokenizerChoice", "bleu_tokenizer", "exact_match", "score_corpus", "translate_and_score"]
