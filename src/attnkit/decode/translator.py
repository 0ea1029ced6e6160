"""The Python API for translating text with a trained checkpoint."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.data.batching import collate
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decode.greedy import greedy_search
from attnkit.models import build_model
from attnkit.runtime import resolve_device
from attnkit.train.checkpoint import load_checkpoint


@dataclass
class Translation:
    source: str
    text: str
    score: float  # summed log-probability of the output (EOS included)
    src_pieces: list[str]
    tgt_pieces: list[str]
    attention: torch.Tensor | None = None  # (len(tgt_pieces)+1, H, S) last decoder layer cross-attention


class Translator:
    """`Translator.from_checkpoint(path).translate(["ein Satz"])` -> translations with scores."""

    def __init__(self, model, src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer, *,
                 device: torch.device | str = "cpu", max_len_a: float = 1.2, max_len_b: int = 10):
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.model = model.to(self.device).eval()
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.max_src_len = model.config.max_positions - 1

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto") -> Translator:
        ckpt = load_checkpoint(path)
        model = build_model(ckpt.kind, ckpt.config.model)
        model.load_state_dict(ckpt.model_state)
        src_tok = SubwordTokenizer.from_bytes(ckpt.tokenizers["src"])
        tgt_tok = SubwordTokenizer.from_bytes(ckpt.tokenizers["tgt"]) if "tgt" in ckpt.tokenizers else src_tok
        t = ckpt.config.train
        return cls(model, src_tok, tgt_tok, device=device, max_len_a=t.max_len_a, max_len_b=t.max_len_b)

    def encode_sources(self, sentences: list[str]) -> list[np.ndarray]:
        ids = []
        for i, ids_i in enumerate(self.src_tok.encode(sentences)):
            if len(ids_i) > self.max_src_len:
                warnings.warn(f"input {i + 1} has {len(ids_i)} tokens; truncated to {self.max_src_len}",
                              stacklevel=3)
                ids_i = ids_i[: self.max_src_len]
            ids.append(np.asarray(ids_i, dtype=np.int64))
        return ids

    def translate(self, sentences: list[str], *, batch_size: int = 64,
                  need_attention: bool = False) -> list[Translation]:
        """Translate in length-sorted batches (less padding), returning results in input order."""
        src_ids = self.encode_sources(sentences)
        order = sorted(range(len(sentences)), key=lambda i: len(src_ids[i]))
        results: list[Translation | None] = [None] * len(sentences)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = collate([(src_ids[i], np.zeros(0, dtype=np.int64)) for i in idx], idx).to(self.device)
            hyps = greedy_search(self.model, batch.src, max_len_a=self.max_len_a, max_len_b=self.max_len_b,
                                 need_attention=need_attention)
            texts = self.tgt_tok.decode(hyps.tokens)
            for j, i in enumerate(idx):
                results[i] = Translation(
                    source=sentences[i], text=texts[j], score=float(hyps.scores[j]),
                    src_pieces=self.src_tok.pieces(batch.src[j][batch.src[j].ne(0)].tolist()),
                    tgt_pieces=self.tgt_tok.pieces(hyps.tokens[j]),
                    attention=None if hyps.attention is None else hyps.attention[j][..., : int(batch.src[j].ne(0).sum())],
                )
        return results  # type: ignore[return-value]

    def translate_texts(self, sentences: list[str], **kw) -> list[str]:
        return [t.text for t in self.translate(sentences, **kw)]
