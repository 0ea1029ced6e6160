"""Glossaries: the target term a translation must use wherever a source term occurs.

A glossary is a TSV file, one `source term<TAB>target term` per line (blank lines and lines starting with `#` are
skipped); a line without its two fields is refused in one line naming the file and line. `Glossary.terms_in`
finds which entries a source sentence holds:

- case is ignored, and a term matches whole words only ("cat" does not match "catalogue"), except in scripts written
  without spaces (Han, kana: `attnkit.data.text.UNSPACED`), where a term matches wherever its characters occur;
- with `inflected=True` each word of a term also matches with up to three more letters after it ("dog" matches
  "dogs", "Hund" matches "Hunde" and "Hundes"), for languages that inflect; the user asks for it, because it also
  matches words that merely start alike.

The search that places the target terms is `attnkit.decode.constrained`; tests/test_glossary.py checks both.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

from attnkit.data.text import UNSPACED, read_lines
from attnkit.errors import DataError

INFLECTION = r"[^\W\d_]{0,3}"  # the letters an inflected form may add to a term's word (`inflected=True`)


@dataclass(frozen=True)
class Term:
    source: str
    target: str


@dataclass(frozen=True)
class Glossary:
    """Entries in the order given; where two source terms overlap in a sentence, the longer one wins."""

    terms: tuple[Term, ...]
    inflected: bool = False

    @classmethod
    def read(cls, path: str | os.PathLike, inflected: bool = False) -> Glossary:
        """The TSV file at `path` (a DataError naming its file and line where an entry is malformed)."""
        lines = read_lines(path)
        return cls(tuple(_term(line, f"{path}:{i}") for i, line in enumerate(lines, 1) if _is_entry(line)), inflected)

    @classmethod
    def from_pairs(cls, pairs, inflected: bool = False, origin: str = "glossary") -> Glossary:
        """Entries given as (source, target) pairs, e.g. from a service request; errors name `origin`[i]."""
        return cls(tuple(_checked(str(s), str(t), f"{origin}[{i}]") for i, (s, t) in enumerate(pairs)), inflected)

    @cached_property
    def _patterns(self) -> list[tuple[re.Pattern, Term]]:
        longest_first = sorted(self.terms, key=lambda term: -len(term.source))
        return [(_pattern(term.source, self.inflected), term) for term in longest_first]

    def terms_in(self, sentence: str) -> list[Term]:
        """The entries whose source term occurs in `sentence`, once per occurrence, in the order they occur;
        characters a longer term took are not matched again by a shorter one."""
        taken = [False] * len(sentence)
        found: list[tuple[int, Term]] = []
        for pattern, term in self._patterns:
            for m in pattern.finditer(sentence):
                if not any(taken[m.start() : m.end()]):
                    taken[m.start() : m.end()] = [True] * (m.end() - m.start())
                    found.append((m.start(), term))
        return [term for _, term in sorted(found, key=lambda x: x[0])]


def _is_entry(line: str) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#")


def _term(line: str, where: str) -> Term:
    fields = line.split("\t")
    if len(fields) != 2:
        raise DataError(f"{where}: a glossary line is 'source term<TAB>target term'; this one has "
                        f"{len(fields)} field(s)")
    return _checked(fields[0], fields[1], where)


def _checked(source: str, target: str, where: str) -> Term:
    source, target = source.strip(), target.strip()
    if not source or not target:
        raise DataError(f"{where}: an empty {'source' if not source else 'target'} term")
    return Term(source, target)


def _pattern(source: str, inflected: bool) -> re.Pattern:
    """Whole words, case ignored; no word boundary around characters of unspaced scripts."""
    ending = INFLECTION if inflected else ""
    words = [re.escape(w) + ("" if UNSPACED.search(w[-1]) else ending) for w in source.split()]
    body = r"\s+".join(words)
    before = "" if UNSPACED.match(source[0]) else r"(?<!\w)"
    after = "" if UNSPACED.match(source[-1]) else r"(?!\w)"
    return re.compile(before + body + after, re.IGNORECASE)


__all__ = ["Glossary", "Term"]
