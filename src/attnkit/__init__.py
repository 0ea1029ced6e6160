"""attnkit: train, run, measure and understand attention models."""

from attnkit.config import RunConfig, TrainConfig, TransformerConfig
from attnkit.data import SubwordTokenizer, prepare
from attnkit.decode import Translation, Translator, greedy_search
from attnkit.eval import score_corpus
from attnkit.models import Transformer
from attnkit.train.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "RunConfig",
    "SubwordTokenizer",
    "TrainConfig",
    "Trainer",
    "Transformer",
    "TransformerConfig",
    "Translation",
    "Translator",
    "greedy_search",
    "prepare",
    "score_corpus",
]
