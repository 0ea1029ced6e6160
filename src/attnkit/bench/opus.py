"""The model of the mt-opus-* workloads: one random MarianMTModel directory at the shape of the Helsinki-NLP
opus-mt models, built once with Hugging Face transformers and kept in a cache folder, and what each toolkit reads
from it: the directory itself (transformers), CTranslate2's conversions of it (float32 and int8, by its own
`ctranslate2.converters.TransformersConverter`) and attnkit's import of it (`attnkit.formats.marian.import_marian`,
saved as an attnkit checkpoint, as `attnkit import --from marian` writes it).

    python -m attnkit.bench.opus [--quick] [--parts hf ct2-float32 ct2-int8 attnkit]   # build what is missing

Each part is built in a process of its own (`ensure`), so a measuring process's peak RSS never holds the building
(transformers' model, a converter, the importer's two copies of the weights). The folder is $ATTNKIT_BENCH_CACHE,
else $XDG_CACHE_HOME/attnkit/bench (~/.cache/attnkit/bench), with one subfolder per shape:

    marian-v65001-d512-h8-f2048-l6-s0-r1/
      hf/                                   config.json, model.safetensors, generation_config.json, source.spm,
                                            target.spm, vocab.json, tokenizer_config.json
      ct2-<version>-float32/, ct2-<version>-int8/
      attnkit-<version>-<importer sha256>.safetensors   (the sha256 of attnkit/formats/*.py)

A part is written under a temporary name and renamed, so an interrupted build leaves nothing half-written; a new
CTranslate2, attnkit or importer gets a conversion or import of its own (delete the folder to rebuild everything).

The directory mimics Helsinki-NLP/opus-mt-zh-en: Marian base (d 512, 8 heads, FFN 2048, 6+6 layers), swish,
Marian's sinusoids, embeddings scaled by sqrt(d), one table for source, target and output, `final_logits_bias`,
65,001 tokens (vocab.json: </s> 0, <unk> 1, 32,499 Chinese-like source pieces, 32,499 English-like target pieces,
<pad> 65,000, which is also the decoder start) and a generation config that bans <pad> (`bad_words_ids`) as
opus-mt's does. Its sentencepiece models are written piece by piece (unigram, one side's pieces each), not
trained: no corpus is needed and every machine gets the same bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import string
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from attnkit import __version__
from attnkit.bench.workloads import MARIAN_EOS, MARIAN_UNK, QUICK, STANDARD, MTShape, marian_source_pieces
from attnkit.io import atomic_folder

SEED = 0
REVISION = 1  # of what write_hf writes: a new revision builds a new folder
MAX_POSITIONS = 512  # opus-mt's max_position_embeddings
PARTS = ("hf", "ct2-float32", "ct2-int8", "attnkit")
# The part each toolkit reads.
TOOLKIT_PART = {"attnkit": "attnkit", "attnkit-int8": "attnkit", "huggingface": "hf",
                "ctranslate2": "ct2-float32", "ctranslate2-int8": "ct2-int8"}
NEEDS = {"transformers": "transformers", "sentencepiece": "sentencepiece", "google.protobuf": "protobuf"}
IMPORTER = "attnkit.formats.marian"


# --- where the parts live --------------------------------------------------------------------------
def cache_root() -> Path:
    if os.environ.get("ATTNKIT_BENCH_CACHE"):
        return Path(os.environ["ATTNKIT_BENCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit" / "bench"


def model_root(s: MTShape) -> Path:
    return cache_root() / f"marian-v{s.vocab}-d{s.d_model}-h{s.heads}-f{s.ffn}-l{s.layers}-s{SEED}-r{REVISION}"


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _importer_digest() -> str:
    """sha256 of the importer's source, every module of its package (12 hex digits): an import made by other code is
    not reused."""
    spec = importlib.util.find_spec(IMPORTER) if _has(IMPORTER) else None
    if not (spec and spec.origin):
        return "none"
    digest = hashlib.sha256()
    for module in sorted(Path(spec.origin).parent.glob("*.py")):
        digest.update(module.name.encode() + b"\0" + module.read_bytes())
    return digest.hexdigest()[:12]


def part_path(s: MTShape, part: str) -> Path:
    root = model_root(s)
    if part == "hf":
        return root / "hf"
    if part in ("ct2-float32", "ct2-int8"):
        return root / f"ct2-{importlib.metadata.version('ctranslate2')}-{part.removeprefix('ct2-')}"
    if part == "attnkit":
        return root / f"attnkit-{__version__}-{_importer_digest()}.safetensors"
    raise ValueError(f"unknown part {part!r}; known: {', '.join(PARTS)}")


def unavailable(part: str) -> str:
    """Why this machine cannot build a part ('' when it can)."""
    needs = {**NEEDS, **({"ctranslate2": "ctranslate2"} if part.startswith("ct2-") else {})}
    missing = [pip for module, pip in needs.items() if not _has(module)]
    if missing:
        return f"the opus-mt-shape model is built with {' and '.join(missing)} (pip install {' '.join(missing)})"
    if part == "attnkit" and not _has(IMPORTER):
        return f"{IMPORTER} (the Marian importer) is not in this attnkit"
    return ""


def ensure(s: MTShape, parts: Iterable[str]) -> dict[str, Path]:
    """The parts' paths, the missing ones built first in a fresh process; RuntimeError with its last line."""
    paths = {part: part_path(s, part) for part in parts}
    todo = [part for part, path in paths.items() if not path.exists()]
    if todo:
        cmd = [sys.executable, "-m", "attnkit.bench.opus", "--shape", json.dumps(dataclasses.asdict(s)),
               "--parts", *todo]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise RuntimeError(f"building the opus-mt-shape model in {model_root(s)} failed: {last[:300]}")
    return paths


def marian_vocab(hf: Path) -> list[str]:
    """vocab.json's pieces in id order (Marian ids)."""
    ids = json.loads((hf / "vocab.json").read_text(encoding="utf-8"))
    vocab = [""] * len(ids)
    for piece, i in ids.items():
        vocab[i] = piece
    return vocab


def directory_params(hf: Path) -> int:
    """Parameters in the directory's model.safetensors (the tied table once), read from its header alone: an
    8-byte little-endian length, then JSON naming each tensor's shape."""
    with (hf / "model.safetensors").open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(math.prod(t["shape"]) for name, t in header.items()
               if name != "__metadata__" and not name.endswith("final_logits_bias"))  # a buffer, not a parameter


# --- building --------------------------------------------------------------------------------------
def build(s: MTShape, parts: Iterable[str]) -> None:
    """Build the parts that are missing (the directory first: every other part is made from it)."""
    hf = part_path(s, "hf")
    if not hf.exists():
        _atomic_dir(hf, functools.partial(write_hf, s))
    for part in parts:
        path = part_path(s, part)
        if path.exists() or part == "hf":
            continue
        if part == "attnkit":
            import_attnkit(hf, path)
        else:
            _atomic_dir(path, functools.partial(convert_ct2, hf, quantization=part.removeprefix("ct2-")))


def _atomic_dir(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) into a folder beside `path` that becomes `path` only when it is whole (io.atomic_folder)."""
    with atomic_folder(path) as tmp:
        write(tmp)


def write_hf(s: MTShape, out: Path) -> None:
    """A save_pretrained MarianMTModel directory with random weights (seeded) and its MarianTokenizer files.

    The weights are drawn with std 1/sqrt(d) rather than transformers' 0.02, so that every product keeps its
    input's scale (the embeddings have unit variance once scaled by sqrt(d), as attnkit's own): with 0.02 the
    sublayers hardly touch the residual stream, and at d 64 every sentence came out as one token repeated."""
    from transformers import MarianConfig, MarianMTModel

    pad = s.vocab - 1
    cfg = MarianConfig(vocab_size=s.vocab, decoder_vocab_size=s.vocab, d_model=s.d_model, encoder_layers=s.layers,
                       decoder_layers=s.layers, encoder_attention_heads=s.heads, decoder_attention_heads=s.heads,
                       encoder_ffn_dim=s.ffn, decoder_ffn_dim=s.ffn, activation_function="swish",
                       max_position_embeddings=MAX_POSITIONS, scale_embedding=True, dropout=s.dropout,
                       attention_dropout=0.0, activation_dropout=0.0, pad_token_id=pad, decoder_start_token_id=pad,
                       eos_token_id=MARIAN_EOS, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                       init_std=s.d_model**-0.5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = MarianMTModel(cfg).eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        # The pad row is the decoder's start and stays zero, as in the opus-mt models: CTranslate2 starts Marian
        # models from a zero vector instead of reading that row.
        model.get_input_embeddings().weight[pad].zero_()
        # The spread of the decoder's own part of the logits (h . E, sqrt(d) * init_std = 1): with it the greedy
        # choices' margins had medians of 0.25 (d 512, 6+6 layers, 8 sentences) and 0.64 (d 64, 16 sentences), none
        # under 1e-4, so float rounding does not flip a choice between engines, while the decoder picks the tokens.
        spread = cfg.init_std * math.sqrt(s.d_model)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=g) * spread)
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(out)
    write_tokenizer(s.vocab, out)


def source_pieces(n: int) -> list[str]:
    """Chinese-like pieces: CJK characters, then the same after the word boundary ▁, then pairs."""
    chars = [chr(c) for c in range(0x4E00, 0x9FA6)]  # the 20,902 CJK unified ideographs of Unicode 1.1
    pairs = (a + b for a in chars for b in chars)
    return list(itertools.islice(itertools.chain(chars, ("▁" + c for c in chars), pairs), n))


def target_pieces(n: int) -> list[str]:
    """English-like pieces: ▁, then ▁w and w for the words a, b, ..., z, aa, ab, ..."""
    words = ("".join(t) for k in itertools.count(1) for t in itertools.product(string.ascii_lowercase, repeat=k))
    return list(itertools.islice(itertools.chain(["▁"], (x for w in words for x in ("▁" + w, w))), n))


def spm_model(pieces: list[str]) -> bytes:
    """A unigram sentencepiece model holding <unk>, <s>, </s> and `pieces` (more frequent first)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    m.trainer_spec.vocab_size = len(pieces) + 3
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = True
    m.normalizer_spec.escape_whitespaces = True
    kinds = pb.ModelProto.SentencePiece
    for piece, kind in (("<unk>", kinds.UNKNOWN), ("<s>", kinds.CONTROL), ("</s>", kinds.CONTROL)):
        m.pieces.add(piece=piece, score=0.0, type=kind)
    for rank, piece in enumerate(pieces):
        m.pieces.add(piece=piece, score=-math.log(rank + 2), type=kinds.NORMAL)
    return m.SerializeToString()


def write_tokenizer(vocab: int, out: Path) -> None:
    """source.spm, target.spm and vocab.json (joint: </s>, <unk>, source pieces, target pieces, <pad>), written by
    MarianTokenizer.save_pretrained so that MarianTokenizer.from_pretrained reads them."""
    from transformers import MarianTokenizer

    n_src = marian_source_pieces(vocab)
    src, tgt = source_pieces(n_src), target_pieces(vocab - 3 - n_src)
    ids = {"</s>": MARIAN_EOS, "<unk>": MARIAN_UNK, **{p: 2 + i for i, p in enumerate(src + tgt)}, "<pad>": vocab - 1}
    with tempfile.TemporaryDirectory(prefix="attnkit-bench-marian-") as staging:
        folder = Path(staging)
        (folder / "source.spm").write_bytes(spm_model(src))
        (folder / "target.spm").write_bytes(spm_model(tgt))
        (folder / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
        tokenizer = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                                    source_lang="zh", target_lang="en", model_max_length=MAX_POSITIONS)
        tokenizer.save_pretrained(out)


def convert_ct2(hf: Path, out: Path, *, quantization: str) -> None:
    """CTranslate2's own converter, as `ct2-transformers-converter --model HF --quantization Q` runs it."""
    import ctranslate2

    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out), quantization=quantization, force=True)


def import_attnkit(hf: Path, out: Path) -> None:
    """attnkit's import of the directory, saved as an attnkit checkpoint; older imports in the folder are removed."""
    from attnkit.checkpoint import save_checkpoint
    from attnkit.formats.marian import import_marian

    save_checkpoint(out, import_marian(hf))
    for old in out.parent.glob("attnkit-*.safetensors"):
        if old != out:
            old.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m attnkit.bench.opus",
                                 description="build the opus-mt-shape model of the mt-opus-* workloads (what is "
                                             f"missing) under {cache_root()}; prints the parts' paths")
    ap.add_argument("--quick", action="store_true", help="the smoke shape of `attnkit bench --quick`")
    ap.add_argument("--shape", help="an MTShape as JSON (instead of the standard or --quick shape)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = ap.parse_args(argv)
    shape = MTShape(**json.loads(args.shape)) if args.shape else (QUICK if args.quick else STANDARD).mt_opus
    build(shape, args.parts)
    for part in args.parts:
        print(part_path(shape, part))


if __name__ == "__main__":
    main(sys.argv[1:])
