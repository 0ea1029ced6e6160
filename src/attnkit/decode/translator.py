"""The Python API for translating text with a trained checkpoint.

`Translator.from_checkpoint(path)` loads the model and its tokenizers; `translate(sentences, DecodeOptions(...))`
encodes the sources (after a Marian target-language tag where there is one, `attnkit.data.target_tags`), runs
greedy search, beam search or sampling over batches cut to a memory budget (`attnkit.decode.memory`) and builds
one `Translation` per source; `score` is forced decoding of given targets.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from attnkit.checkpoint import check_same_tokenizers, load_checkpoint, model_from
from attnkit.config import TransformerConfig
from attnkit.cpu import for_inference
from attnkit.data.batching import collate
from attnkit.data.glossary import Glossary
from attnkit.data.target_tags import TargetTags
from attnkit.data.text import check_unicode
from attnkit.data.tokenizer_kinds import Tokenizer, tokenizer_from_bytes
from attnkit.decode.beam import beam_search
from attnkit.decode.constrained import SentenceTerms, constrained_beam_search, unmet_in
from attnkit.decode.ensemble import Ensemble
from attnkit.decode.greedy import greedy_search, sample
from attnkit.decode.memory import SearchShape, default_budget, plan_batches, search_bytes
from attnkit.decode.options import DecodeOptions, Translation, pad_nbest, usable_quantization
from attnkit.decode.scoring import score_targets
from attnkit.decode.search import Hypothesis
from attnkit.decode.shortlist import Shortlisted, VocabShortlist
from attnkit.errors import CheckpointError, ConfigError, DataError
from attnkit.runtime import resolve_device

GLOSSARY_BEAM = 5  # the least beam a sentence with glossary terms is searched with: the banks need room


class Translator:
    """`Translator.from_checkpoint(path).translate(["ein Satz"], beam=5)` -> translations with scores.

    Its searches run `attnkit.cpu.for_inference`'s copy of the model, which shares its weights and keeps prepacked
    copies of them, rebuilt when a weight changes.
    `quantize="int8"` keeps int8 copies instead (CPU only; where they would not be fast, a warning says why
    and the Translator stays in float32: `self.quantize` is what it runs).

    A multilingual model (a Marian one whose vocabulary holds target-language tags, `>>cmn_Hans<<`) is told the
    language to translate into by the tag its sources start with: `target_tag="cmn_Hans"` puts it before every
    source, and a source that starts with a tag the vocabulary holds keeps its own (MarianTokenizer's rule).
    """

    def __init__(self, model, src_tok: Tokenizer, tgt_tok: Tokenizer, *,
                 device: torch.device | str = "cpu", max_len_a: float = 1.2, max_len_b: int = 10,
                 quantize: str | None = None, target_tag: str | None = None,
                 shortlist: VocabShortlist | None = None):
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.model = model.to(self.device).eval()
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.max_src_len = model.config.max_positions - 1  # room for the source EOS
        self.quantize = usable_quantization(quantize, self.device)
        self.fast = for_inference(self.model, int8=self.quantize == "int8")  # what the searches run
        self.lang_tags = TargetTags(src_tok, target_tag)  # MarianTokenizer's rule (attnkit.data.target_tags)
        self.shortlist = shortlist  # the searches' output drawn from each sentence's shortlist (decode/shortlist.py)

    @property
    def searcher(self):
        """What the searches run: the inference copy, over the shortlist where there is one (forced scoring runs the
        copy itself, over the whole vocabulary, as Marian's scorer does)."""
        return self.fast if self.shortlist is None else Shortlisted(self.fast, self.shortlist)

    @property
    def tags(self) -> dict[str, int]:
        """The target-language tags the source vocabulary holds: {"cmn_Hans": the id of >>cmn_Hans<<}."""
        return self.lang_tags.ids

    @property
    def target_tag(self) -> str | None:
        """The tag put before every source that has none; a tag the vocabulary lacks is a one-line ConfigError."""
        return self.lang_tags.default

    @target_tag.setter
    def target_tag(self, tag: str | None) -> None:
        self.lang_tags.default = tag

    def tag_id(self, tag: str) -> int:
        """The id of a target-language tag, named as `cmn_Hans` or `>>cmn_Hans<<`."""
        return self.lang_tags.id(tag)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", quantize: str | None = None, *,
                        target_tag: str | None = None, shortlist: bool = True) -> Translator:
        return cls.from_checkpoints([path], device=device, quantize=quantize, target_tag=target_tag,
                                    shortlist=shortlist)

    @classmethod
    def from_checkpoints(cls, paths: list[str | Path], device: str = "auto", quantize: str | None = None, *,
                         target_tag: str | None = None, shortlist: bool = True) -> Translator:
        """One checkpoint, or several decoded as an ensemble (their probabilities averaged, `Ensemble`): they
        must share the tokenizers (one prepared dataset); the output length limits and the lexical shortlist (where
        it has one; `shortlist=False`: none) are the first one's."""
        if not paths:
            raise ConfigError("Translator.from_checkpoints needs at least one checkpoint")
        ckpts = [translation_checkpoint(p) for p in paths]
        first = ckpts[0]
        check_same_tokenizers(paths, ckpts, "an ensemble's checkpoints must come from the same prepared data")
        models = [model_from(ckpt, path) for path, ckpt in zip(paths, ckpts)]
        src_tok = tokenizer_from_bytes(first.tokenizers["src"])
        tgt_tok = tokenizer_from_bytes(first.tokenizers["tgt"]) if "tgt" in first.tokenizers else src_tok
        t = first.config.train
        lex = VocabShortlist.from_tensors(first.shortlist) if shortlist and first.shortlist else None
        return cls(models[0] if len(models) == 1 else Ensemble(models), src_tok, tgt_tok, device=device,
                   max_len_a=t.max_len_a, max_len_b=t.max_len_b, quantize=quantize, target_tag=target_tag,
                   shortlist=lex)

    def encode_sources(self, sentences: list[str], number_from: int = 1) -> list[np.ndarray]:
        """Subword ids, after the target-language tag where there is one; inputs longer than the model's positions
        are truncated with a warning naming the input, counted from `number_from` (the caller's numbering: a file's
        line number when it translates line by line). A text that is not Unicode (a lone surrogate) is refused in one
        line naming the input."""
        check_unicode(sentences, number_from)
        ids = []
        for i, ids_i in enumerate(self.lang_tags.encode(sentences), start=number_from):
            if len(ids_i) > self.max_src_len:
                warnings.warn(f"input {i} has {len(ids_i)} tokens; truncated to {self.max_src_len}", stacklevel=3)
                ids_i = ids_i[: self.max_src_len]
            ids.append(np.asarray(ids_i, dtype=np.int64))
        return ids

    def output_limit(self, opts: DecodeOptions) -> tuple[float, int, int]:
        """(a, b, cap): outputs stop at min(a * |src| + b, cap) tokens; the cap keeps them inside the positions."""
        cap = self.max_src_len  # = the model's positions - 1 (the room the source EOS takes in the source)
        return (self.max_len_a if opts.max_len_a is None else opts.max_len_a,
                self.max_len_b if opts.max_len_b is None else opts.max_len_b,
                min(opts.max_len, cap) if opts.max_len else cap)

    def search(self, src: torch.Tensor, opts: DecodeOptions, *, prefix: torch.Tensor | None = None,
               need_attention: bool = False) -> list[list[Hypothesis]]:
        """Dispatch to greedy search, beam search or sampling for one padded batch (B, S)."""
        a, b, cap = self.output_limit(opts)
        common = dict(max_len_a=a, max_len_b=b, max_len=cap, min_len=opts.min_len, prefix=prefix,
                      no_repeat_ngram=opts.no_repeat_ngram, need_attention=need_attention,
                      attention_layer=opts.attention_layer)
        if opts.sampling:
            return self._sample(src, opts, common)
        if opts.beam == 1:
            return greedy_search(self.searcher, src, **common)
        return beam_search(self.searcher, src, beam=opts.beam, nbest=opts.nbest, len_penalty=opts.len_penalty,
                           len_style=opts.len_style, **common)

    def _sample(self, src: torch.Tensor, opts: DecodeOptions, common: dict) -> list[list[Hypothesis]]:
        """`opts.nbest` independent samples per sentence (its rows repeated), most probable first."""
        gen = torch.Generator(device=self.device).manual_seed(opts.seed)
        n = opts.nbest
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(n)
        if common["prefix"] is not None:
            common = {**common, "prefix": common["prefix"].index_select(0, rows)}
        drawn = sample(self.searcher, src.index_select(0, rows), temperature=opts.temperature, top_k=opts.top_k,
                       top_p=opts.top_p, generator=gen, **common)
        return [sorted((h for hyps in drawn[i * n : (i + 1) * n] for h in hyps), key=lambda h: -h.score)
                for i in range(src.size(0))]

    def _prefix_batch(self, prefixes: list[str] | None, idx: list[int]) -> torch.Tensor | None:
        if prefixes is None:
            return None
        rows = [np.asarray(ids, dtype=np.int64) for ids in self.tgt_tok.encode([prefixes[i] for i in idx])]
        return collate([(r, r) for r in rows], idx).tgt_in[:, 1:].to(self.device)  # (B, P), PAD-padded

    def translate(self, sentences: list[str], options: DecodeOptions | None = None, *,
                  prefixes: list[str] | None = None, batch_size: int = 64, max_tokens: int = 0,
                  need_attention: bool = False, memory_budget: int | None = None, number_from: int = 1,
                  glossary: Glossary | None = None, **kw) -> list[Translation]:
        """Translate in length-sorted batches (less padding); results come back in input order.

        Options come as a DecodeOptions or as keywords (`beam=5, len_penalty=1.0`); `prefixes` force
        each output to start with the given target text. With nbest > 1 each result lists the others
        in `.nbest`. Batches hold at most `batch_size` sentences and, if set, `max_tokens` source tokens,
        and are cut further until each search fits in `memory_budget` bytes (default: half the memory
        available when the call starts); a sentence that cannot fit alone raises ConfigError. A truncation
        warning numbers the sentences from `number_from` (1: the first of `sentences`). With a `glossary`, a
        sentence that holds its source terms and whose translation lacks a target term is searched again alone, by
        constrained beam search (beam at least GLOSSARY_BEAM); its `terms` say which target terms the output uses.
        """
        opts = options or DecodeOptions(**kw)
        self._check_request(sentences, prefixes, opts, need_attention, glossary)
        src_ids = self.encode_sources(sentences, number_from)
        terms = [SentenceTerms.of(glossary.terms_in(s), self.tgt_tok) if glossary else None for s in sentences]
        budget = default_budget(self.device) if memory_budget is None else memory_budget
        knob = ("--nbest", opts.nbest) if opts.sampling else ("--beam", opts.beam)
        results: list[Translation | None] = [None] * len(sentences)
        for idx in plan_batches([len(s) + 1 for s in src_ids],  # with EOS
                                lambda n, src_len: self.search_bytes(n, src_len, opts, need_attention),
                                batch_size=batch_size, max_tokens=max_tokens, budget=budget, knob=knob):
            batch = collate([(src_ids[i], np.zeros(0, dtype=np.int64)) for i in idx], idx).to(self.device)
            nbests = self._search_batch(batch.src, idx, opts, prefixes, need_attention, terms)
            for j, i in enumerate(idx):
                n_src = int(batch.src[j].ne(0).sum())
                src_pieces = self.src_tok.pieces(batch.src[j, :n_src].tolist())
                hyps = [self._translation(sentences[i], src_pieces, h, n_src, terms[i])
                        for h in pad_nbest(nbests[j], opts.nbest)]
                hyps[0].nbest = hyps[1:]
                results[i] = hyps[0]
        _warn_unplaced(results, number_from)
        return results  # type: ignore[return-value]

    def _search_batch(self, src: torch.Tensor, idx: list[int], opts: DecodeOptions, prefixes: list[str] | None,
                      need_attention: bool, terms: list[SentenceTerms | None]) -> list[list[Hypothesis]]:
        """src (B, S) searched together; a sentence with glossary terms whose best translation lacks one of them is
        searched again alone, by constrained beam search (a translation that already uses every term stays)."""
        out = self.search(src, opts, prefix=self._prefix_batch(prefixes, idx), need_attention=need_attention)
        alone = []
        for j, i in enumerate(idx):
            if terms[i] is not None and terms[i].constraints:
                for h in out[j]:
                    h.unmet = unmet_in(h.tokens, terms[i].constraints)
                alone += [j] if not out[j] or out[j][0].unmet else []
        a, b, cap = self.output_limit(opts)
        for j in alone:
            one = src[j : j + 1, : int(src[j].ne(0).sum())]  # (1, S) without padding
            out[j] = constrained_beam_search(  # over the whole vocabulary: a shortlist may lack a term's pieces
                self.fast, one, terms[idx[j]].constraints, beam=max(opts.beam, GLOSSARY_BEAM), nbest=opts.nbest,
                max_len_a=a, max_len_b=b, max_len=cap, min_len=opts.min_len, len_penalty=opts.len_penalty,
                len_style=opts.len_style, no_repeat_ngram=opts.no_repeat_ngram, need_attention=need_attention,
                attention_layer=opts.attention_layer)
        return out

    def search_bytes(self, sentences: int, src_len: int, opts: DecodeOptions, need_attention: bool = False) -> int:
        """An upper estimate of the memory one search over `sentences` sources of `src_len` tokens takes."""
        a, b, cap = self.output_limit(opts)
        one = search_bytes(SearchShape.of(self.model.config), sentences=sentences,
                           expand=opts.nbest if opts.sampling else opts.beam, src_len=src_len,
                           out_len=min(int(src_len * a + b), cap), need_attention=need_attention)
        return one * (len(self.model) if isinstance(self.model, Ensemble) else 1)  # each member searches alike

    def _check_request(self, sentences: list[str], prefixes: list[str] | None, opts: DecodeOptions,
                       need_attention: bool, glossary: Glossary | None) -> None:
        if prefixes is not None and len(prefixes) != len(sentences):
            raise DataError(f"{len(prefixes)} prefixes for {len(sentences)} sentences: give one per sentence")
        if glossary is not None and (opts.sampling or prefixes is not None):
            given = "sampling" if opts.sampling else "prefixes"
            raise ConfigError(f"a glossary places its terms by beam search: not with {given}")
        layers = self.attention_layers
        if need_attention and not -layers <= opts.attention_layer < layers:
            raise ConfigError(f"--alignment-layer {opts.attention_layer}: the model has {layers} cross-attention "
                              f"layer(s), so use 0..{layers - 1} (or -{layers}..-1)")

    @property
    def attention_layers(self) -> int:
        """Cross-attention maps per decoding step: one per Transformer decoder layer; RNNs have one."""
        return self.model.config.n_decoder_layers if isinstance(self.model.config, TransformerConfig) else 1

    def _translation(self, source: str, src_pieces: list[str], h: Hypothesis, n_src: int,
                     terms: SentenceTerms | None = None) -> Translation:
        return Translation(source=source, text=self.tgt_tok.decode([h.tokens])[0], score=h.score,
                           src_pieces=src_pieces, tgt_pieces=self.tgt_tok.pieces(h.tokens),
                           attention=None if h.attention is None else h.attention[..., :n_src],
                           norm_score=h.norm_score, tokens=list(h.tokens),
                           terms=[] if terms is None else terms.uses(h.unmet))

    def translate_texts(self, sentences: list[str], **kw) -> list[str]:
        return [t.text for t in self.translate(sentences, **kw)]

    def score(self, sources: list[str], targets: list[str], batch_size: int = 64) -> list[float]:
        """Forced decoding: log P(target | source) per pair, EOS included."""
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets: score needs one target per source")
        src_ids = self.encode_sources(sources)
        check_unicode(targets)
        tgt_ids = [np.asarray(ids, dtype=np.int64) for ids in self.tgt_tok.encode(targets)]
        out: list[float] = []
        for start in range(0, len(sources), batch_size):
            idx = list(range(start, min(start + batch_size, len(sources))))
            batch = collate([(src_ids[i], tgt_ids[i]) for i in idx], idx).to(self.device)
            out += score_targets(self.fast, batch.src, batch.tgt_in, batch.tgt_out).tolist()
        return out


def _warn_unplaced(results: list[Translation], number_from: int) -> None:
    """A glossary term the best translation does not use is said, never dropped silently."""
    for i, t in enumerate(results, start=number_from):
        for use in t.terms:
            if not use.placed:
                warnings.warn(f"input {i}: the glossary term {use.source!r} -> {use.target!r} is not in the "
                              f"translation ({use.note})", stacklevel=3)


def translation_checkpoint(path: str | Path):
    """The checkpoint at `path`, refused where it holds a language model."""
    ckpt = load_checkpoint(path)
    if "src" not in ckpt.tokenizers:
        raise CheckpointError(f"{path} holds a '{ckpt.kind}' model, not a translation model "
                              "(language models run with `attnkit lm eval` / `lm generate`)")
    return ckpt


__all__ = ["DecodeOptions", "Translation", "Translator"]
