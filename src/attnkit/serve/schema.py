"""What a client may send and what it gets back, and the caps the server puts on it.

Everything a request controls is validated here, before the request joins a batch: a value past a cap
is a 422 that names the field, and text that the tokenizer could not take (a lone surrogate is valid JSON
but not valid Unicode) is refused for its own request alone, never inside a batch beside good ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attnkit.data.glossary import Glossary
from attnkit.data.text import lone_surrogate
from attnkit.decode.translator import DecodeOptions, Translation
from attnkit.errors import ConfigError

_D = DecodeOptions  # its field defaults are the API's defaults: one source of truth


@dataclass(frozen=True)
class Limits:
    """Server-side caps on what one request may ask (the `attnkit serve --max-*` options)."""

    max_request_sentences: int = 64  # more: 413
    max_chars: int = 1000  # per sentence; more: 413
    max_beam: int = 16  # beam, and n-best (also the number of samples); more: 422
    max_output_tokens: int = 256  # per sentence; the `max_len` a client may ask for, and the default
    max_top_k: int = 1000

    def __post_init__(self) -> None:
        if min(self.max_request_sentences, self.max_chars, self.max_beam, self.max_output_tokens,
               self.max_top_k) < 1:
            raise ConfigError("serve: every --max-* limit must be at least 1")


MAX_GLOSSARY_TERMS = 1000  # entries one request's glossary may hold


class GlossaryFields(BaseModel):
    """A request's glossary: [source term, target term] pairs its translations must use (attnkit.data.glossary)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    glossary: list[list[str]] | None = Field(None, max_length=MAX_GLOSSARY_TERMS,
                                             description="[source term, target term] pairs the translation keeps")
    glossary_inflected: bool = Field(False, description="a term's words also match with up to three more letters")

    def glossary_of(self, options: DecodeOptions, limits: Limits) -> Glossary | None:
        """The Glossary, or ConfigError naming the field: a pair that is not two terms, a term over --max-chars,
        text that is not Unicode, or sampling (terms are placed by beam search)."""
        if not self.glossary:
            return None
        for i, pair in enumerate(self.glossary):
            if len(pair) != 2:
                raise ConfigError(f"field 'glossary.{i}': give [source term, target term], not {len(pair)} string(s)")
            for term in pair:
                check_text(term, f"glossary.{i}")
                if len(term) > limits.max_chars:
                    raise ConfigError(f"field 'glossary.{i}': a term of {len(term)} characters; the limit is "
                                      f"{limits.max_chars}")
        if options.sampling:
            raise ConfigError("field 'glossary': terms are placed by beam search, not with sampling")
        return Glossary.from_pairs(self.glossary, self.glossary_inflected, origin="glossary")


class TranslateRequest(GlossaryFields):
    """One sentence (`text`) or several (`texts`), how to search, and a glossary if any."""

    text: str | None = None
    texts: list[str] | None = Field(None, min_length=1)
    beam: int = Field(_D.beam, ge=1)
    nbest: int = Field(_D.nbest, ge=1, description="hypotheses to return (best in the result, others in .nbest)")
    max_len: int = Field(0, ge=0, description="at most this many output tokens per sentence (0: the server's cap)")
    len_penalty: float = Field(_D.len_penalty, ge=-5.0, le=5.0)
    sampling: bool = _D.sampling
    temperature: float = Field(_D.temperature, gt=0.0, le=100.0)
    top_k: int = Field(_D.top_k, ge=0)
    top_p: float = _D.top_p
    seed: int = Field(_D.seed, ge=0, le=2**63 - 1)
    alignment: bool = Field(False, description="for each target piece, the source piece it attends to most")

    @model_validator(mode="after")
    def _one_of_text_or_texts(self) -> TranslateRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("give exactly one of 'text' (a string) or 'texts' (a list of strings)")
        return self

    def sentences(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])

    def fields(self) -> list[str]:
        """The JSON path of each sentence, for error messages."""
        return ["text"] if self.text is not None else [f"texts.{i}" for i in range(len(self.texts or []))]

    def options(self, limits: Limits) -> DecodeOptions:
        """The DecodeOptions, within `limits`; ConfigError names the offending field as the API spells it."""
        for name, value, cap in (("beam", self.beam, limits.max_beam), ("nbest", self.nbest, limits.max_beam),
                                 ("max_len", self.max_len, limits.max_output_tokens),
                                 ("top_k", self.top_k, limits.max_top_k)):
            if value > cap:
                raise ConfigError(f"field '{name}': {value} is over this server's limit of {cap}")
        try:
            return DecodeOptions(beam=self.beam, nbest=self.nbest, len_penalty=self.len_penalty,
                                 sampling=self.sampling, temperature=self.temperature, top_k=self.top_k,
                                 top_p=self.top_p, seed=self.seed, max_len=self.max_len or limits.max_output_tokens)
        except ConfigError as e:
            raise ConfigError(api_words(str(e))) from None


class ExploreRequest(GlossaryFields):
    """POST /explore: one input for the attention explorer; a translation server searches with `beam` and shows
    `nbest` hypotheses, using the glossary's terms if one is given (a language-model server reads `text`, and ignores
    neither: it refuses beam or nbest > 1)."""

    text: str
    beam: int = Field(1, ge=1)
    nbest: int = Field(1, ge=1)

    def options(self, limits: Limits) -> DecodeOptions:
        for name, value in (("beam", self.beam), ("nbest", self.nbest)):
            if value > limits.max_beam:
                raise ConfigError(f"field '{name}': {value} is over this server's limit of {limits.max_beam}")
        if self.nbest > self.beam:
            raise ConfigError(f"field 'nbest': {self.nbest} hypotheses need a beam of at least {self.nbest}")
        return DecodeOptions(beam=self.beam, nbest=self.nbest, max_len=limits.max_output_tokens)


class GenerateRequest(BaseModel):
    """POST /generate: sample `length` tokens after `prompt` (as `attnkit lm generate` with the same values)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    prompt: str = ""
    length: int = Field(100, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = Field(0, ge=0, le=2**63 - 1)

    def check(self, limits: Limits) -> None:
        for name, value, cap in (("length", self.length, limits.max_output_tokens),
                                 ("top_k", self.top_k, limits.max_top_k)):
            if value > cap:
                raise ConfigError(f"field '{name}': {value} is over this server's limit of {cap}")


def api_words(message: str) -> str:
    """A library message names CLI flags (--beam); over HTTP they are JSON fields (beam)."""
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m[1].replace("-", "_"), message)


def check_text(text: str, field: str) -> None:
    """ConfigError unless the tokenizer can take `text`. JSON can carry a lone surrogate ("\\ud800"), which
    is not Unicode. Anything else goes through unchanged, so that an answer equals `attnkit translate` of
    the same line."""
    if at := lone_surrogate(text):
        raise ConfigError(f"field '{field}': not valid Unicode (a lone surrogate at character {at})")


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="summed log-probability of the output, EOS included")
    norm_score: float = Field(description="the score the search ranked by")


class TermOut(BaseModel):
    source: str
    target: str
    placed: bool = Field(description="whether the translation uses the target term")
    note: str = Field(description="why not, where it does not")


class TranslationOut(Hypothesis):
    nbest: list[Hypothesis] = Field(description="the other hypotheses, best first")
    alignment: list[int] | None = Field(description="source position per target piece, if asked for")
    terms: list[TermOut] | None = Field(None, description="with a glossary: the terms the source held")

    @classmethod
    def of(cls, t: Translation, alignment: bool, glossary: bool = False) -> TranslationOut:
        return cls(text=t.text, score=t.score, norm_score=t.norm_score,
                   nbest=[Hypothesis(text=h.text, score=h.score, norm_score=h.norm_score) for h in t.nbest],
                   alignment=t.alignment if alignment else None,
                   terms=[TermOut(**vars(u)) for u in t.terms] if glossary else None)


class TranslateResponse(BaseModel):
    translations: list[TranslationOut]


class Health(BaseModel):
    status: str
    model: str
    device: str
    quantize: str = Field("none", description="none (float32) or int8: the weights the searches run with")
    kernels: str = Field("", description="with int8: the engine and the bits its kernels sum exactly "
                                         "(7-bit weights where they add pairs of products in 16 bits)")
    queue: int = Field(description="requests waiting for the worker")


class ErrorOut(BaseModel):
    error: str


__all__ = ["ErrorOut", "ExploreRequest", "GenerateRequest", "GlossaryFields", "Health", "Limits", "TranslateRequest",
           "TranslateResponse", "TranslationOut", "api_words", "check_text"]
