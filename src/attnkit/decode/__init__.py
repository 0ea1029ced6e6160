"""Decoding over the models' encode / step interface: greedy, beam search, sampling, forced scoring."""

from attnkit.decode.beam import beam_search
from attnkit.decode.document import translate_document
from attnkit.decode.ensemble import Ensemble
from attnkit.decode.greedy import greedy_search, sample
from attnkit.decode.scoring import score_targets
from attnkit.decode.search import Hypothesis
from attnkit.decode.translator import DecodeOptions, Translation, Translator

__all__ = ["DecodeOptions", "Ensemble", "Hypothesis", "Translation", "Translator", "beam_search", "greedy_search",
           "sample", "score_targets", "translate_document"]
