"""Marian's target-language tags: a multilingual model is told the language to translate into by a `>>tag<<`
piece at the start of its source.

A multilingual Marian vocabulary holds one piece per target language (`>>cmn_Hans<<`, `>>deu<<`), and the model
was trained with one of them first in every source. MarianTokenizer's rule, followed here: a source that starts
with a tag the vocabulary holds keeps its own (cut off the text and put first as its id); any other source gets
the chosen default tag, if there is one. tests/test_marian.py checks the ids against MarianTokenizer's.
"""

from __future__ import annotations

import difflib

from attnkit.data.tokenizer_kinds import Tokenizer
from attnkit.errors import ConfigError


def is_tag(piece: str) -> bool:
    """A target-language tag as Marian's multilingual vocabularies hold them, >>cmn_Hans<< (MarianTokenizer's
    supported_language_codes: a piece that starts with >> and ends with <<)."""
    return len(piece) > 4 and piece.startswith(">>") and piece.endswith("<<")


def target_tags(tok: Tokenizer) -> dict[str, int]:
    """{tag name: id} of the target-language tags among a vocabulary's pieces ({} for most models)."""
    return {piece[2:-2]: i for i, piece in enumerate(tok.pieces(list(range(tok.vocab_size)))) if is_tag(piece)}


class TargetTags:
    """The target-language tags of a source vocabulary (read when first needed) and the default one put before
    every source that has none (None: sources are encoded as they are)."""

    def __init__(self, tok: Tokenizer, default: str | None = None):
        self.tok = tok
        self._ids: dict[str, int] | None = None
        self.default = default

    @property
    def ids(self) -> dict[str, int]:
        """{"cmn_Hans": the id of >>cmn_Hans<<} for every tag the vocabulary holds."""
        if self._ids is None:
            self._ids = target_tags(self.tok)
        return self._ids

    @property
    def default(self) -> str | None:
        return self._default

    @default.setter
    def default(self, tag: str | None) -> None:
        """A tag the vocabulary lacks is a one-line ConfigError (and the default stays as it was)."""
        self._default_id = None if tag is None else self.id(tag)
        self._default = tag

    def id(self, tag: str) -> int:
        """The id of a target-language tag, named as `cmn_Hans` or `>>cmn_Hans<<`; an unknown one is a ConfigError
        listing the known ones and the closest."""
        name = tag[2:-2] if is_tag(tag) else tag
        if name in self.ids:
            return self.ids[name]
        if not self.ids:
            raise ConfigError(f"target tag {tag!r}: this model's vocabulary holds no target-language tags "
                              "(>>xx<< pieces): it translates into one language")
        known = sorted(self.ids)
        close = difflib.get_close_matches(name, known, n=1)
        raise ConfigError(f"target tag {tag!r} is not in this model's vocabulary (it knows {len(known)}: "
                          f"{', '.join(known[:8])}{', ...' if len(known) > 8 else ''})"
                          f"{f'; did you mean {close[0]!r}?' if close else ''}")

    def split(self, text: str) -> tuple[str, int | None]:
        """(the text to tokenize, the id of the tag its source starts with, or the default's, or None). As
        MarianTokenizer reads a source, a leading >>tag<< is cut off the text; here only a tag the vocabulary holds."""
        if text.startswith(">>"):
            end = text.find("<<")
            if end != -1 and text[2:end] in self.ids:
                return text[end + 2:], self.ids[text[2:end]]
        return text, self._default_id

    def encode(self, texts: list[str]) -> list:
        """Each text's subword ids, after the id of its target-language tag where it has one."""
        split = [self.split(text) for text in texts]
        ids = self.tok.encode([text for text, _ in split])
        return [ids_i if tag is None else [tag, *ids_i] for (_, tag), ids_i in zip(split, ids)]


__all__ = ["TargetTags", "is_tag", "target_tags"]
