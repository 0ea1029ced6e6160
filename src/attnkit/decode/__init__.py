"""Decoding: greedy search over the models' encode/step interface, and the Translator API."""

from attnkit.decode.greedy import Hypotheses, greedy_search
from attnkit.decode.translator import Translation, Translator

__all__ = ["Hypotheses", "Translation", "Translator", "greedy_search"]
