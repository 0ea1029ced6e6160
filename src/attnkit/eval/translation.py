"""Translate a test set and score it: the one path behind the dev figures of training, the demo's
final evaluation and the experiments' tables, so that they agree on the same data."""

from __future__ import annotations

from attnkit.decode import DecodeOptions, Translation, Translator
from attnkit.eval.bleu import Scores, TokenizerChoice, score_corpus

# Sentences a search batch: a larger batch spreads each step's fixed cost over more sentences (the translations are
# the same at any size), until the padding of sentences of different lengths costs more than it saves.
SCORING_BATCH = 128


def translate_and_score(translator: Translator, sources: list[str], refs: list[str],
                        options: DecodeOptions | None = None, *, lang: str | None = None,
                        tokenizer: TokenizerChoice | None = None) -> tuple[list[Translation], Scores]:
    """Translations of `sources` (greedy unless `options` say otherwise) and their scores against `refs`, BLEU
    tokenised for target language `lang` (`score_corpus`; `tokenizer` when the caller chose it already)."""
    translations = translator.translate(sources, options or DecodeOptions(), batch_size=SCORING_BATCH)
    return translations, score_corpus([t.text for t in translations], refs, lang=lang, tokenizer=tokenizer)
