"""Translating with a CTranslate2 export of an attnkit Transformer (`attnkit.formats.ctranslate2` writes them).

`CT2Translator.from_dir(folder).translate(sentences, options)` answers as `attnkit.decode.Translator` does, with
the same tokenisation, `Translation`s, scores and ranking. How attnkit's search maps onto CTranslate2's:

- Sources carry their EOS explicitly (so that alignments may point at it); the output limit a * |src| + b is
  CTranslate2's `max_decoding_length`, one call per distinct limit; `min_len` and `no_repeat_ngram` are its options.
- Scores: with `length_penalty=0` CTranslate2 returns summed log-probabilities, EOS included (`return_end_token`),
  which are attnkit's scores; attnkit divides by its own length penalty (|Y| + 1 tokens, EOS counted).
- Beam search: the beams that run are attnkit's (the first K candidates that are not EOS), but CTranslate2 stops
  at K finished hypotheses, where attnkit goes on until no running beam can win. So the search goes on to the
  limit (a patience that never stops it), every finished hypothesis comes back, and attnkit ranks them: the best
  ones are the ones attnkit finds. PAD and BOS are banned (`suppress_sequences`), as attnkit bans them.
- CTranslate2 renormalises the probabilities after a ban, attnkit does not: the answers of a search with bans are
  scored again by forced decoding (`score_batch`). Greedy search needs no ban (its argmax is never PAD or BOS in
  a trained model; where it is, that sentence runs again with the ban), so its scores come straight from the
  search. Beam search with `min_len` or `no_repeat_ngram` ranks renormalised candidates: it warns that its
  results can differ.
- A hypothesis cut at the limit, where attnkit forces EOS, gets that EOS and its score by forced decoding.
- Alignments come from the last decoder layer, heads averaged (fixed in the export); `_first_attention` works
  around CTranslate2's batched beam search, which returns a wrong first row for all but a batch's first sentence.
- A source without pieces: CTranslate2 does not run the model on it, and the answer is an empty translation.

`ctranslate2` is imported inside the functions that use it: attnkit works without it.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.config import BOS_ID, EOS_ID, PAD_ID
from attnkit.data.batching import collate
from attnkit.data.target_tags import TargetTags
from attnkit.data.tokenizer_kinds import Tokenizer, load_tokenizer
from attnkit.decode.options import DecodeOptions, Translation, pad_nbest
from attnkit.decode.search import Hypothesis, length_penalty, max_lengths
from attnkit.decode.translator import Translator
from attnkit.errors import AttnkitError, CheckpointError, ConfigError, DataError

FORMAT = "attnkit-ctranslate2"
VERSION = 1
META_FILE = "attnkit.json"  # beside CTranslate2's files: tokenizers, decoding defaults, where it came from


def require_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to get it."""
    try:
        import ctranslate2
    except ImportError:
        raise AttnkitError("the CTranslate2 export and engine need the ctranslate2 package: "
                           "pip install ctranslate2") from None
    return ctranslate2


def check_export(path: str | os.PathLike) -> dict:
    """The `attnkit.json` of an export folder, checked (files present, a version this attnkit reads)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder: --engine ctranslate2 runs a folder written by "
                              "`attnkit export --format ctranslate2`" if path.exists() else f"no such folder: {path}")
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no {META_FILE}: it was not written by `attnkit export`") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / META_FILE} cannot be read: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path / META_FILE} is not an attnkit CTranslate2 export description")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise CheckpointError(f"{path} was written by a newer attnkit (export version {meta.get('version')})")
    for name in ["model.bin", *meta["tokenizers"].values()]:
        if not (path / name).is_file():
            raise CheckpointError(f"{path} lacks {name}: export the checkpoint again")
    return meta


@dataclass
class _Found(Hypothesis):
    ended: bool = True  # False: cut at the length limit, where attnkit forces EOS
    exact: bool = True  # the score is attnkit's: no ban renormalised the probabilities it sums


def _device(device: str) -> tuple[str, int]:
    """attnkit's --device (cpu, cuda, cuda:N, auto) as CTranslate2's device and index."""
    name, _, index = device.partition(":")
    if name not in ("cpu", "cuda", "auto") or (index and (name != "cuda" or not index.isdigit())):
        raise ConfigError(f"--device {device!r}: use cpu, cuda, cuda:N or auto")
    return name, int(index or 0)


class CT2Translator:
    """`CT2Translator.from_dir(export).translate(["ein Satz"], beam=5)`: CTranslate2 runs the search, and the
    results are the `Translation`s `attnkit.decode.Translator` gives (same tokenisation, scores and ranking)."""

    encode_sources = Translator.encode_sources  # the same truncation (with its warning) to the model's positions
    tags = Translator.tags  # and the same reading of a leading target-language tag (>>cmn_Hans<<)
    output_limit = Translator.output_limit  # the same a * |src| + b and cap
    translate_texts = Translator.translate_texts
    _one_translation = Translator._translation

    def __init__(self, translator, src_tok: Tokenizer, tgt_tok: Tokenizer, *, max_positions: int,
                 decoder_layers: int, max_len_a: float = 1.2, max_len_b: int = 10):
        self.translator = translator  # a ctranslate2.Translator
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        self.decoder_layers = decoder_layers
        self.max_src_len = max_positions - 1  # room for the source EOS
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt_tok.pieces(list(range(tgt_tok.vocab_size))))}
        self.src_eos, self.tgt_eos = src_tok.pieces([EOS_ID])[0], tgt_tok.pieces([EOS_ID])[0]
        self.banned = [tgt_tok.pieces([PAD_ID]), tgt_tok.pieces([BOS_ID])]  # never produced, as in attnkit
        self.lang_tags = TargetTags(src_tok)  # a source's own leading tag only: no --target-tag here

    @classmethod
    def from_dir(cls, path: str | os.PathLike, *, threads: int = 0, compute_type: str = "default",
                 device: str = "cpu") -> CT2Translator:
        """Load an export. threads: CTranslate2's intra_threads (0: its default); compute_type: its name for the
        arithmetic (default: the type the weights were saved in); device: cpu, cuda, cuda:N or auto."""
        meta = check_export(path)
        ct2 = require_ctranslate2()
        name, index = _device(device)
        path = Path(path)
        torch_threads = torch.get_num_threads()
        try:
            translator = ct2.Translator(str(path), device=name, device_index=index, compute_type=compute_type,
                                        intra_threads=threads)
        except (RuntimeError, ValueError) as e:
            raise CheckpointError(f"CTranslate2 cannot load {path}: {e}") from None
        finally:  # loading sets OpenMP's thread count of this thread, which is torch's: the caller's stays
            torch.set_num_threads(torch_threads)
        toks = {side: load_tokenizer(path / file) for side, file in meta["tokenizers"].items()}
        return cls(translator, toks["src"], toks["tgt"], max_positions=meta["max_positions"],
                   decoder_layers=meta["decoder_layers"], **meta["decode"])

    @property
    def attention_layers(self) -> int:
        return self.decoder_layers

    def output_limits(self, src_ids: list[np.ndarray], opts: DecodeOptions) -> list[int]:
        """Each sentence's output limit, as attnkit's searches compute it: min(a * |src| + b, cap) tokens."""
        a, b, cap = self.output_limit(opts)
        src = collate([(ids, np.zeros(0, dtype=np.int64)) for ids in src_ids], range(len(src_ids))).src
        return max_lengths(src, a, b, cap).tolist()

    def _check_request(self, prefixes: list[str] | None, opts: DecodeOptions, need_attention: bool) -> None:
        if prefixes is not None:
            raise ConfigError("--prefix-file is not available with --engine ctranslate2: CTranslate2 leaves a forced "
                              "prefix out of the score, attnkit counts it (use --engine attnkit)")
        if opts.sampling:
            raise ConfigError("--sampling is not available with --engine ctranslate2: its random draws cannot be "
                              "attnkit's (use --engine attnkit)")
        if opts.beam > 1 and (opts.min_len or opts.no_repeat_ngram):
            warnings.warn("--engine ctranslate2: beam search with --min-len or --no-repeat-ngram ranks probabilities "
                          "renormalised after the ban (attnkit's are not), so its results can differ from attnkit's",
                          stacklevel=3)
        layers = self.decoder_layers
        if need_attention and opts.attention_layer % layers != layers - 1:
            raise ConfigError(f"--alignment-layer {opts.attention_layer % layers + 1}: a CTranslate2 export carries "
                              f"the cross-attention of its last decoder layer ({layers}) only")

    def translate(self, sentences: list[str], options: DecodeOptions | None = None, *,
                  prefixes: list[str] | None = None, batch_size: int = 64, max_tokens: int = 0,
                  need_attention: bool = False, memory_budget: int | None = None, number_from: int = 1,
                  glossary=None, **kw) -> list[Translation]:
        """As `Translator.translate`: results in input order, n-best in `.nbest`. CTranslate2 batches (at most
        `batch_size` sentences or, if set, `max_tokens` tokens) and manages its memory itself: `memory_budget`
        is accepted for the same signature and not used; a `glossary` is refused (attnkit's search places terms)."""
        if glossary is not None:
            raise ConfigError("a glossary's terms are placed by attnkit's constrained beam search, not by CTranslate2")
        opts = options or DecodeOptions(**kw)
        self._check_request(prefixes, opts, need_attention)
        src_ids = self.encode_sources(sentences, number_from)
        batching = dict(max_batch_size=max_tokens or batch_size, batch_type="tokens" if max_tokens else "examples")
        search = functools.partial(self._search, src_ids, self.output_limits(src_ids, opts), opts, need_attention,
                                   batching)
        # Greedy search runs without bans, so that its scores are exact; where it chose PAD or BOS (attnkit never
        # does), it runs again with them banned. Beam search bans them from the start: they could take a beam.
        found = search(range(len(sentences)), ban=opts.beam > 1)
        again = [i for i, hyps in found.items() if {PAD_ID, BOS_ID} & set(hyps[0].tokens)] if opts.beam == 1 else []
        found.update(search(again, ban=True))
        # Hypotheses cut at the limit get attnkit's forced EOS; the answers scored after a ban get attnkit's scores.
        self._rescore(src_ids, [(i, h) for i, hyps in found.items() for h in hyps if not h.ended], batch_size)
        best = {i: self._rank(hyps, opts) for i, hyps in found.items()}
        self._rescore(src_ids, [(i, h) for i, hyps in best.items() for h in {id(h): h for h in hyps}.values()
                                if not h.exact], batch_size)
        return [self._translation(sentences[i], src_ids[i], self._rank(best[i], opts)) for i in range(len(sentences))]

    def _search(self, src_ids: list[np.ndarray], limits: list[int], opts: DecodeOptions, need_attention: bool,
                batching: dict, idx, *, ban: bool) -> dict[int, list[_Found]]:
        """Every hypothesis CTranslate2 returns for the sentences `idx`, one call per output limit. A source without
        content (its EOS alone) CTranslate2 does not run: it answers an empty output, scored later (attention:
        the one source position takes all of it)."""
        by_limit, found = defaultdict(list), {}
        for i in idx:
            if len(src_ids[i]):
                by_limit[limits[i]].append(i)
            else:
                found[i] = [_Found([], 0.0, 0.0, torch.ones(1, 1, 1) if need_attention else None, False, False)]
        renormalised = ban or bool(opts.min_len or opts.no_repeat_ngram)
        for limit, group in sorted(by_limit.items()):
            sources = [self._source(src_ids[i]) for i in group]
            results = self.translator.translate_batch(sources, **self._search_options(opts, limit, ban),
                                                      return_attention=need_attention, **batching)
            firsts = self._first_attention(sources, batching) if need_attention and opts.beam > 1 else None
            for j, (i, result) in enumerate(zip(group, results)):
                found[i] = self._hypotheses(result, need_attention, renormalised)
                for h in found[i] if firsts else ():
                    h.attention[0, 0] = firsts[j]
        return found

    def _first_attention(self, sources: list[list[str]], batching: dict) -> list[torch.Tensor]:
        """The attention of every sentence's first output position (S,), which all its hypotheses share. CTranslate2
        4.x's batched beam search returns the first row of the first sentence for every sentence of a batch (on
        CPU, where the first step runs one row per sentence); one greedy step gives the right rows."""
        results = self.translator.translate_batch(sources, beam_size=1, max_decoding_length=1, min_decoding_length=0,
                                                  return_end_token=True, return_attention=True, max_input_length=0,
                                                  **batching)
        return [torch.tensor(r.attention[0][0]) for r in results]

    def _source(self, ids: np.ndarray) -> list[str]:
        return self.src_tok.pieces(ids.tolist()) + [self.src_eos]

    def _search_options(self, opts: DecodeOptions, limit: int, ban: bool) -> dict:
        search = dict(beam_size=opts.beam, length_penalty=0.0, max_decoding_length=limit,
                      min_decoding_length=min(opts.min_len, limit), no_repeat_ngram_size=opts.no_repeat_ngram,
                      suppress_sequences=self.banned if ban else None, return_end_token=True, return_scores=True,
                      max_input_length=0)
        if opts.beam > 1:  # every finished hypothesis, until the limit (at most beam per step): attnkit ranks them
            search.update(patience=float(limit + 1), num_hypotheses=opts.beam * (limit + 1))
        return search

    def _hypotheses(self, result, need_attention: bool, renormalised: bool) -> list[_Found]:
        """CTranslate2's hypotheses (pieces, EOS included when produced; raw summed log-probabilities, as
        length_penalty is 0) as ids without EOS, with the attention (T, 1, S): the heads already averaged."""
        found = []
        for k, pieces in enumerate(result.hypotheses):
            ended = bool(pieces) and pieces[-1] == self.tgt_eos
            tokens = [self.tgt_ids[p] for p in (pieces[:-1] if ended else pieces)]
            attention = torch.tensor(result.attention[k])[:, None] if need_attention else None
            found.append(_Found(tokens, float(result.scores[k]), 0.0, attention, ended, ended and not renormalised))
        return found

    def _rescore(self, src_ids: list[np.ndarray], pairs: list[tuple[int, _Found]], batch_size: int) -> None:
        """Forced decoding of (sentence, hypothesis) pairs: log P(tokens + EOS | source), as attnkit scores them."""
        if not pairs:
            return
        scores = self._score([self._source(src_ids[i]) for i, _ in pairs],
                             [self.tgt_tok.pieces(h.tokens) for _, h in pairs], batch_size)
        for (_, h), score in zip(pairs, scores):
            h.score, h.exact = score, True

    def _score(self, sources: list[list[str]], targets: list[list[str]], batch_size: int) -> list[float]:
        results = self.translator.score_batch(sources, targets, max_batch_size=batch_size, max_input_length=0)
        return [float(sum(r.log_probs)) for r in results]  # the target's tokens and the EOS CTranslate2 adds

    def _rank(self, hyps: list[_Found], opts: DecodeOptions) -> list[_Found]:
        """The n best, by attnkit's normalisation (greedy: the score itself), padded to n as attnkit pads."""
        for h in hyps:
            h.norm_score = h.score if opts.beam == 1 else \
                h.score / length_penalty(len(h.tokens) + 1, opts.len_penalty, opts.len_style)
        return pad_nbest(sorted(hyps, key=lambda h: -h.norm_score), opts.nbest)

    def _translation(self, source: str, ids: np.ndarray, hyps: list[_Found]) -> Translation:
        src_pieces = self._source(ids)
        out = [self._one_translation(source, src_pieces, h, len(src_pieces)) for h in hyps]
        out[0].nbest = out[1:]
        return out[0]

    def score(self, sources: list[str], targets: list[str], batch_size: int = 64) -> list[float]:
        """Forced decoding: log P(target | source) per pair, EOS included (as `Translator.score`)."""
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets: score needs one target per source")
        src_ids = self.encode_sources(sources)
        return self._score([self._source(ids) for ids in src_ids],
                           [self.tgt_tok.pieces(ids) for ids in self.tgt_tok.encode(targets)], batch_size)


__all__ = ["CT2Translator", "check_export", "require_ctranslate2"]
