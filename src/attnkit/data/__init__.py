"""Data flow, stage by stage: text files -> tokenizer -> encoded splits -> padded batches."""

from attnkit.data.batching import Batch, TokenBatchSampler, collate, iterate_batches
from attnkit.data.dataset import (
    EncodedSplit,
    PrepareReport,
    SplitCounts,
    load_split,
    load_tokenizers,
    prepare,
    resegment_train,
)
from attnkit.data.demo_corpus import make_number_corpus, write_number_corpus
from attnkit.data.text import iter_lines, read_lines, read_parallel, resolve_prefix, write_lines
from attnkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordTokenizer

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Batch",
    "EncodedSplit",
    "PrepareReport",
    "SplitCounts",
    "SubwordTokenizer",
    "TokenBatchSampler",
    "collate",
    "iter_lines",
    "iterate_batches",
    "load_split",
    "load_tokenizers",
    "make_number_corpus",
    "prepare",
    "read_lines",
    "read_parallel",
    "resegment_train",
    "resolve_prefix",
    "write_lines",
    "write_number_corpus",
]
