"""A fairseq model's text side: its dictionaries (dict.SRC.txt, dict.TGT.txt) and the pipeline that splits text into
their symbols, found the way fairseq finds it and stored as attnkit tokenizers.

Two pipelines:
- sentencepiece (`--bpe sentencepiece`): the model file, mapped to attnkit's rows by `side_tokenizer` (as Marian's);
- Moses + subword-nmt BPE (`--tokenizer moses --bpe subword_nmt`: fairseq's released WMT'14 / WMT'16 models and
  most models trained on text prepared with its examples' scripts): the codes file (bpecodes, or `code` in older
  archives) and the Moses settings, as attnkit.data.moses_bpe's tokenizer.

Which one: what the checkpoint's settings name (cfg.bpe / cfg.tokenizer, or the older args.bpe / args.tokenizer),
else what lies beside the checkpoint (a sentencepiece model, else BPE codes). A released model's checkpoint names
neither (fairseq's hub passes `tokenizer='moses', bpe='subword_nmt'` for every translation model with BPE codes),
so codes found beside a checkpoint that names no tokenizer are read after Moses, as the hub reads them;
`moses=False` (`--no-moses`) is for codes learned on text split otherwise. fastBPE (the WMT'19 models) and GPT-2's
byte BPE are refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnkit.data.moses_bpe import MosesBPETokenizer, check_codes
from attnkit.errors import CheckpointError, DataError
from attnkit.formats.inert_pickle import state_of
from attnkit.formats.marian_vocab import Vocab, read_spm, side_tokenizer

SPMS = ("sentencepiece.bpe.model", "spm.model", "sentencepiece.model")  # a folder's sentencepiece model
CODES = ("bpecodes", "code")  # a folder's subword-nmt codes (fairseq's archives name them so)
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary: bos 0, pad 1, eos 2, unk 3
NOT_LANGUAGES = ("src", "tgt")  # fairseq's placeholders where a model's languages are not named


def read_dictionary(path: Path) -> Vocab:
    """A fairseq dict.txt as {symbol: id}: the four specials, then one `SYMBOL COUNT` per line (`#fairseq:overwrite`
    after the count lets a line name a symbol again), as fairseq's Dictionary.add_from_file reads it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (the model's dictionary)")
    pieces = {s: i for i, s in enumerate(SPECIALS)}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        word, _, count = line.rstrip().rpartition(" ")
        overwrite = count == "#fairseq:overwrite"
        if overwrite:
            word, _, count = word.rpartition(" ")
        if not word or not count.lstrip("-").isdigit():
            raise CheckpointError(f"{path}:{n}: not 'SYMBOL COUNT': {line[:60]!r}")
        if word in pieces and not overwrite:
            raise CheckpointError(f"{path}:{n}: {word!r} is named twice (fairseq refuses it too)")
        pieces.setdefault(word, len(pieces))
    return Vocab(pieces, path)


def dictionaries(folders: list[Path], langs: tuple[str, str], path: Path) -> tuple[Vocab, Vocab]:
    """dict.SRC.txt and dict.TGT.txt from the first of `folders` holding both."""
    names = [f"dict.{lang}.txt" for lang in langs]
    for folder in folders:
        if all((folder / n).is_file() for n in names):
            return read_dictionary(folder / names[0]), read_dictionary(folder / names[1])
    where = ", ".join(str(f) for f in folders)
    raise CheckpointError(f"{path}: no {names[0]} and {names[1]} beside it or in {where} (fairseq's dictionaries: "
                          "pass the data-bin folder that holds them with --vocab)")


def _named(ckpt: dict, part: str) -> dict:
    """cfg.<part> (bpe, tokenizer) with its `_name`, or the older args' settings named by args.<part>; {} if none."""
    named = state_of(state_of(ckpt.get("cfg")).get(part))
    if named.get("_name"):
        return named
    args = state_of(ckpt.get("args"))
    return {**args, "_name": args[part]} if isinstance(args.get(part), str) else {}


@dataclass(frozen=True)
class TextPipeline:
    """How the model's text was split: a sentencepiece model, or BPE codes (after Moses in `langs`' rules, or
    after splitting at spaces where `langs` is None); `source` is the file the pieces come from."""

    source: Path
    spm: Any = None  # a sentencepiece ModelProto
    codes: str | None = None
    langs: tuple[str, str] | None = None
    escape: bool = True
    dash_splits: bool = True

    @property
    def spms(self) -> list:
        """The sentencepiece models whose pieces the dictionaries may lack (attnkit rows of their own)."""
        return [self.spm] if self.spm is not None else []

    def tokenizer(self, side: str, names: list[str]) -> bytes:
        """The stored tokenizer of one side ("src" or "tgt") whose ids are attnkit's rows `names`."""
        if self.spm is not None:
            return side_tokenizer(self.spm, names)
        lang = None if self.langs is None else self.langs[side == "tgt"]
        return MosesBPETokenizer(self.codes, names, lang, self.escape, self.dash_splits).to_bytes()


def _found(folder: Path, named: object, usual: tuple[str, ...]) -> Path | None:
    """The file cfg.bpe names (as written, or by its name beside the checkpoint), else the first of `usual` beside
    it; None if there is none."""
    candidates = ([Path(named), folder / Path(named).name] if isinstance(named, str) and named else []) + [
        folder / n for n in usual]
    return next((c for c in candidates if c.is_file()), None)


def _moses(ckpt: dict, moses: bool | None, langs: tuple[str, str], path: Path) -> dict:
    """TextPipeline's Moses fields: cfg.tokenizer's / the older args' (`moses` overrides), or fairseq's hub default
    (Moses) where nothing names a tokenizer. A side's language: the one the tokenizer's settings name, else `langs`'
    (the model's), else English (fairseq's default), placeholders (src, tgt) skipped."""
    tok = _named(ckpt, "tokenizer")
    name = tok.get("_name")
    if moses is None and name not in (None, "moses", "space"):
        raise CheckpointError(f"{path}: its text is tokenized with {name!r} (cfg.tokenizer); attnkit reads Moses "
                              "(sacremoses) or text split at spaces (pass --no-moses if that is what it is)")
    if moses is False or (moses is None and name == "space"):
        return {"langs": None}
    named = (tok.get(f"moses_{side}_lang") or tok.get(f"{side}_lang") for side in ("source", "target"))
    pair = tuple(next((x for x in (n, lang) if x and x not in NOT_LANGUAGES), "en") for n, lang in zip(named, langs))
    return {"langs": pair, "escape": not tok.get("moses_no_escape", False),
            "dash_splits": not tok.get("moses_no_dash_splits", False)}


def text_pipeline(ckpt: dict, path: Path, *, spm: Path | None, codes: Path | None, moses: bool | None,
                  langs: tuple[str, str]) -> TextPipeline:
    """The pipeline a fairseq checkpoint at `path` was trained with (module docstring): `spm` / `codes` given
    explicitly win; `langs` are the model's source and target languages (Moses' rules)."""
    bpe = _named(ckpt, "bpe")
    name = bpe.get("_name")
    if name not in (None, "sentencepiece", "subword_nmt"):
        raise CheckpointError(f"{path}: its text is split with {name!r} (cfg.bpe); attnkit reads sentencepiece "
                              "models and subword-nmt's BPE codes")
    if spm is not None and codes is not None:
        raise CheckpointError(f"{path}: give a sentencepiece model (--spm) or BPE codes (--bpe-codes), not both")
    look_for_spm = codes is None and name != "subword_nmt"
    spm_file = spm or (_found(path.parent, bpe.get("sentencepiece_model"), SPMS) if look_for_spm else None)
    if spm_file is not None:
        return TextPipeline(spm_file, spm=read_spm(spm_file))
    codes_file = codes or (None if name == "sentencepiece" else _found(path.parent, bpe.get("bpe_codes"), CODES))
    if codes_file is None:
        raise CheckpointError(f"{path}: no sentencepiece model ({', '.join(SPMS)}) or BPE codes ({', '.join(CODES)}) "
                              "beside it; pass it with --spm or --bpe-codes")
    if not codes_file.is_file():
        raise CheckpointError(f"{codes_file}: no such file (the BPE codes)")
    text = codes_file.read_text(encoding="utf-8")
    try:
        check_codes(text, str(codes_file))
    except DataError as e:
        raise CheckpointError(str(e)) from None
    return TextPipeline(codes_file, codes=text, **_moses(ckpt, moses, langs, path))


__all__ = ["CODES", "SPECIALS", "SPMS", "TextPipeline", "dictionaries", "read_dictionary", "text_pipeline"]
