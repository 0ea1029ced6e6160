"""Corpora larger than memory: `prepare` and `lm prepare` stream text to token arrays on disk, training memory-maps
them and reads a batch at a time.

Oracles: the safetensors library reads what ArrayWriter writes (and ArrayWriter's reader reads what the library
writes); the streamed prepares write exactly what encoding the whole text in memory gives, whatever the chunk size;
and a process whose data segment may not grow by as much as the corpus's size trains on it (reading the file into
memory, as training did before, fails there with a MemoryError).
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import torch

import attnkit.data.text
from attnkit.data import load_split, load_tokenizers, prepare, read_lines, write_number_corpus
from attnkit.data.arrays import ArrayWriter, map_arrays
from attnkit.data.lm import LMStreams, LMVocab, load_lm_corpus, prepare_lm
from attnkit.data.text import stream_lines
from attnkit.errors import DataError

DTYPES = {"a": np.int32, "b": np.int64, "empty": np.int32, "f": np.float32}


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.integers(-9, 9_999, 1_001).astype(np.int32), "b": rng.integers(0, 2**40, 17),
            "empty": np.zeros(0, np.int32), "f": rng.standard_normal(5).astype(np.float32)}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --- the array files ---------------------------------------------------------------------------


def test_array_writer_files_are_read_by_safetensors_and_the_reverse(tmp_path):
    arrays = _arrays()
    with ArrayWriter(tmp_path / "w.safetensors", DTYPES) as out:
        for name, values in arrays.items():
            for part in np.array_split(values, 3):  # appended in pieces, some of them empty
                out.append(name, part)
        out.finish(metadata={"vocab": "字 and words"})
    read = safetensors.numpy.load_file(tmp_path / "w.safetensors")
    with safetensors.safe_open(tmp_path / "w.safetensors", "np") as f:
        assert f.metadata() == {"vocab": "字 and words"}
    safetensors.numpy.save_file(arrays, tmp_path / "lib.safetensors", metadata={"k": "v"})
    mapped, metadata = map_arrays(tmp_path / "lib.safetensors")
    assert metadata == {"k": "v"}
    assert isinstance(mapped["a"], np.memmap)  # mapped, not read
    for name, values in arrays.items():
        np.testing.assert_array_equal(read[name], values)
        np.testing.assert_array_equal(mapped[name], values)
        assert read[name].dtype == mapped[name].dtype == values.dtype


def test_a_writer_left_by_an_error_writes_nothing(tmp_path):
    path = tmp_path / "kept.safetensors"
    safetensors.numpy.save_file({"a": np.arange(3, dtype=np.int32)}, path)
    before = _files(tmp_path)
    with pytest.raises(KeyboardInterrupt), ArrayWriter(path, {"a": np.int32}) as out:
        out.append("a", np.arange(10))
        raise KeyboardInterrupt
    assert _files(tmp_path) == before  # the old file whole, no spill or temp file left


def test_damaged_array_files_are_one_line_errors_naming_the_file(tmp_path):
    good = tmp_path / "good.safetensors"
    safetensors.numpy.save_file({"a": np.arange(100, dtype=np.int32)}, good)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(DataError, match=r"cut.safetensors: array a: .*truncated"):
        map_arrays(cut)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes((12).to_bytes(8, "little") + b"not json at all")
    with pytest.raises(DataError, match="junk.safetensors: not a safetensors file"):
        map_arrays(junk)
    with pytest.raises(DataError, match="junk.safetensors"):
        load_split(tmp_path, "junk")


# --- streamed text -----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_stream_lines_reads_what_read_lines_reads(tmp_path, suffix):
    data = b"\xef\xbb\xbfein Haus\r\nzwei  H\xc3\xa4user \n\n\x0bdrei\x0bvier"
    path = tmp_path / f"t.txt{suffix}"
    path.write_bytes(gzip.compress(data) if suffix else data)
    assert list(stream_lines(path)) == read_lines(path) == ["ein Haus", "zwei  Häuser ", "", "\x0bdrei\x0bvier"]


@pytest.mark.parametrize("data, message", [(b"", "e.txt is empty"), (b"\xef\xbb\xbf", "e.txt is empty"),
                                           (b"ok\nok\nbad \xff\n", r"e.txt:3: invalid UTF-8")])
def test_stream_lines_errors_are_read_lines_errors(tmp_path, data, message):
    path = tmp_path / "e.txt"
    path.write_bytes(data)
    for reader in (read_lines, lambda p: list(stream_lines(p))):
        with pytest.raises(DataError, match=message):
            reader(path)


# --- the streamed prepares ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def numbers(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    files = write_number_corpus(tmp_path_factory.mktemp("numbers"), n_train=200, n_valid=20, n_test=20)
    src, tgt = files["train"]
    lines = [read_lines(src), read_lines(tgt)]
    lines[0][7], lines[1][50] = "", " "  # pairs that are dropped, on either side of a chunk boundary
    lines[1][120] = " ".join(lines[1][:40])  # one over the length cap
    for path, text in zip(files["train"], lines):
        path.write_text("".join(line + "\n" for line in text), encoding="utf-8")
    return files


def test_prepare_in_small_chunks_writes_the_same_folder(numbers, tmp_path, monkeypatch):
    def run(out: Path):
        return prepare(out, numbers["train"], numbers["valid"], numbers["test"], vocab_size=60, max_src_len=200,
                       max_tgt_len=200)

    whole = run(tmp_path / "whole")
    monkeypatch.setattr(attnkit.data.text, "CHUNK_LINES", 7)
    chunked = run(tmp_path / "chunked")
    assert whole.to_dict() == chunked.to_dict()
    assert whole.splits["train"].dropped_empty == 2 and whole.splits["train"].dropped_too_long == 1
    assert _files(tmp_path / "whole") == _files(tmp_path / "chunked")
    # the in-memory reference: encode every kept pair at once
    src_tok, tgt_tok = load_tokenizers(tmp_path / "chunked")
    src, tgt = read_lines(tmp_path / "chunked" / "train.src.txt"), read_lines(tmp_path / "chunked" / "train.tgt.txt")
    split = load_split(tmp_path / "chunked", "train")
    assert len(split) == len(src) == 197
    assert [split.pair(i)[0].tolist() for i in range(len(split))] == src_tok.encode(src)
    assert [split.pair(i)[1].tolist() for i in range(len(split))] == tgt_tok.encode(tgt)


def test_a_failed_prepare_leaves_the_folder_as_it_was(numbers, tmp_path):
    out = tmp_path / "data"
    prepare(out, numbers["train"], numbers["valid"], vocab_size=60)
    before = _files(out)
    short = tmp_path / "short.en"
    short.write_text("".join(line + "\n" for line in read_lines(numbers["train"][1])[:-1]), encoding="utf-8")
    differ = r"parallel files differ in length: .*train.de has 200 lines, .*short.en has 199"
    with pytest.raises(DataError, match=differ):
        prepare(out, (numbers["train"][0], short), numbers["valid"], vocab_size=60, force=True)
    bad = tmp_path / "bad.de"
    bad.write_bytes(numbers["train"][0].read_bytes().replace(b"\n", b"\n\xff", 1))
    with pytest.raises(DataError, match=r"bad.de:2: invalid UTF-8"):
        prepare(out, (bad, numbers["train"][1]), numbers["valid"], vocab_size=60, force=True)
    assert _files(out) == before


@pytest.mark.parametrize("level, fraction", [("char", 0.1), ("word", 0.25), ("subword", 0.25)])
def test_lm_prepare_in_small_chunks_encodes_as_the_whole_text(tmp_path, monkeypatch, level, fraction):
    text = tmp_path / "text.txt"
    lines = [f"line {i}: the {'cat' if i % 3 else 'dog'} sat {'on the mat' * (i % 4)}" for i in range(103)]
    text.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    monkeypatch.setattr(attnkit.data.text, "CHUNK_LINES", 5)
    corpus = prepare_lm(tmp_path / "lm", text, test=text, level=level, vocab_size=40, valid_fraction=fraction)
    vocab = LMVocab.from_bytes(corpus.vocab.to_bytes())
    if level == "char":  # the vocabulary is the whole file's, the cut in characters
        ids = vocab.encode(lines)
        cut = int(len(ids) * (1 - fraction))
        expected = {"train": ids[:cut], "valid": ids[cut:]}
    else:  # the vocabulary is the kept lines', the cut in lines
        cut = int(len(lines) * (1 - fraction))
        expected = {"train": vocab.encode(lines[:cut]), "valid": vocab.encode(lines[cut:])}
        if level == "word":
            assert vocab.tokens == LMVocab.build(lines[:cut], "word").tokens
    expected["test"] = vocab.encode(lines)
    loaded = load_lm_corpus(tmp_path / "lm")
    assert set(loaded.arrays) == set(expected)
    for name, ids in expected.items():
        np.testing.assert_array_equal(loaded.arrays[name], ids)
        assert loaded.splits[name].dtype == torch.int64 and loaded.splits[name].tolist() == ids.tolist()


def test_lm_streams_read_a_mapped_stream_as_the_tensor(tmp_path):
    with ArrayWriter(tmp_path / "s.safetensors", {"train": np.int32}) as out:
        out.append("train", np.arange(1000) % 97)
        out.finish()
    mapped = map_arrays(tmp_path / "s.safetensors")[0]["train"]
    tensor = torch.arange(1000) % 97
    for ext_len in (0, 3):
        a, b = LMStreams(mapped, 4, 7, ext_len), LMStreams(tensor, 4, 7, ext_len)
        assert len(a) == len(b) and a.n_tokens == b.n_tokens
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert xa.dtype == ya.dtype == torch.int64 and torch.equal(xa, xb) and torch.equal(ya, yb)


# --- training on a corpus larger than the memory the process may take ---------------------------------

# The process imports everything, then caps its data segment (RLIMIT_DATA: heap and private writable mappings, not
# file-backed read-only ones) at what it holds plus MARGIN, and trains on a corpus larger than MARGIN.
MARGIN = 160 * 2**20
_CAPPED = """
import resource, sys
import numpy as np
import torch
from attnkit import config as cfgmod
from attnkit.train.lm_trainer import LMTrainer
from attnkit.train.trainer import Trainer
torch.zeros(64, 64) @ torch.zeros(64, 64)
np.ones((512, 512)) @ np.ones((512, 512))  # the BLAS libraries' buffers, which they allocate on first use
kind, data, run, margin = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
held = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, (held + margin, resource.getrlimit(resource.RLIMIT_DATA)[1]))
if kind == "lm":
    cfg = cfgmod.resolve(["lm-char-small-xl"], ["model.d_model=16", "model.n_heads=2", "model.d_ff=32",
        "model.n_layers=1", "train.tgt_len=16", "train.mem_len=16", "train.batch_size=4", "train.eval_batch_size=2",
        "train.eval_max_tokens=64", "train.device=cpu", "train.max_steps=3", "train.log_every=1"],
        cls=cfgmod.LMRunConfig)
    LMTrainer(cfg, data, run, progress=False).fit()
else:
    cfg = cfgmod.RunConfig(model=cfgmod.TransformerConfig(src_vocab_size=60, tgt_vocab_size=60, d_model=16,
        n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1), train=cfgmod.TrainConfig(max_tokens=512,
        max_steps=3, eval_bleu=False, eval_max_sentences=8, device="cpu", log_every=1))
    Trainer(cfg, data, run, progress=False).fit()
print("trained under the cap")
"""


def _train_capped(kind: str, data: Path, run: Path, margin: int = MARGIN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CAPPED, kind, str(data), str(run), str(margin)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA and /proc/self/status")
def test_an_lm_trains_on_a_corpus_larger_than_its_memory_cap(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat.\n" * 50, encoding="utf-8")
    small = prepare_lm(tmp_path / "data", text, level="char", valid_fraction=0.2)
    n = 3 * MARGIN // 8  # int32 tokens: 1.5 MARGIN on disk, 3 MARGIN as the int64 tensor training once made
    with ArrayWriter(tmp_path / "data" / "corpus.safetensors", {"train": np.int32, "valid": np.int32}) as out:
        for start in range(0, n, 1 << 24):
            out.append("train", np.arange(start, min(n, start + (1 << 24))) % small.vocab.vocab_size)
        out.append("valid", small.arrays["valid"])
        out.finish(metadata={"vocab": small.vocab.to_json()})
    done = _train_capped("lm", tmp_path / "data", tmp_path / "run")
    assert done.returncode == 0 and "trained under the cap" in done.stdout, done.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.safetensors").is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA and /proc/self/status")
def test_a_translation_model_trains_on_a_corpus_larger_than_its_memory_cap(tmp_path):
    files = write_number_corpus(tmp_path / "text", n_train=200, n_valid=10, n_test=10)
    prepare(tmp_path / "data", files["train"], files["valid"], vocab_size=60)
    vocab = load_tokenizers(tmp_path / "data")[0].vocab_size
    margin = 256 * 2**20  # sentencepiece's and the batcher's own allocations need more room than the LM's
    per_side, length = 3 * margin // 16, 48  # int32 ids: 1.5 margin on disk over both sides
    pairs = per_side // length
    offsets = np.arange(pairs + 1, dtype=np.int64) * length
    with ArrayWriter(tmp_path / "data" / "train.safetensors",
                     {"src_ids": np.int32, "src_offsets": np.int64, "tgt_ids": np.int32, "tgt_offsets": np.int64}
                     ) as out:
        for side in ("src", "tgt"):
            for start in range(0, pairs * length, 1 << 24):
                out.append(f"{side}_ids", 4 + np.arange(start, min(pairs * length, start + (1 << 24))) % (vocab - 4))
            out.append(f"{side}_offsets", offsets)
        out.finish()
    done = _train_capped("mt", tmp_path / "data", tmp_path / "run", margin)
    assert done.returncode == 0 and "trained under the cap" in done.stdout, done.stderr[-3000:]
