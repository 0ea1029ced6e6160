"""Data layer: text reading errors, prepare, tokenizer, batching, demo corpus."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    EncodedSplit,
    SubwordTokenizer,
    TokenBatchSampler,
    collate,
    iterate_batches,
    load_split,
    load_tokenizers,
    make_number_corpus,
    prepare,
    read_lines,
    read_parallel,
    resegment_train,
    resolve_prefix,
    write_number_corpus,
)
from attnkit.errors import AttnkitError, ConfigError, DataError

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "house"]
WORDS += ["red", "blue", "big", "small", "quickly", "slowly"]


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def _sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(2, 9))) for _ in range(n)]


# --- text -------------------------------------------------------------------------------------


def test_read_lines_strips_only_line_terminators(tmp_path):
    path = _write(tmp_path / "a.txt", "one \r\ntwo\t\n\nfünf")
    assert read_lines(path) == ["one ", "two\t", "", "fünf"]


def test_gz_reads_like_plain(tmp_path):
    text = "ein Haus\r\nzwei Häuser\n\ndrei\n"
    plain = _write(tmp_path / "c.de", text)
    zipped = tmp_path / "c.de.gz"
    zipped.write_bytes(gzip.compress(text.encode("utf-8")))
    assert read_lines(zipped) == read_lines(plain) == ["ein Haus", "zwei Häuser", "", "drei"]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="no such file: .*nope.txt"):
        read_lines(tmp_path / "nope.txt")


def test_empty_file_is_named(tmp_path):
    path = _write(tmp_path / "empty.txt", "")
    with pytest.raises(DataError, match="empty.txt is empty"):
        read_lines(path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_invalid_utf8_names_file_and_line(tmp_path, suffix):
    data = b"fine\nalso fine\nbad \xff byte\nok\n"
    path = tmp_path / f"bad.txt{suffix}"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with pytest.raises(DataError, match="invalid UTF-8") as err:
        read_lines(path)
    assert f"bad.txt{suffix}:3:" in str(err.value)
    assert "\n" not in str(err.value)


def test_mismatched_parallel_files_name_both_counts(tmp_path):
    src = _write(tmp_path / "x.de", "a\nb\nc\n")
    tgt = _write(tmp_path / "x.en", "a\nb\n")
    with pytest.raises(DataError) as err:
        read_parallel(src, tgt)
    msg = str(err.value)
    assert all(s in msg for s in ("x.de", "x.en", "3", "2"))


def test_resolve_prefix_prefers_plain_then_gz(tmp_path):
    gz = _write(tmp_path / "train.de.gz", gzip.compress(b"x\n"))
    assert resolve_prefix(tmp_path / "train", "de") == gz
    plain = _write(tmp_path / "train.de", "x\n")
    assert resolve_prefix(tmp_path / "train", "de") == plain
    with pytest.raises(DataError, match=r"no such file: .*train\.en\(\.gz\)"):
        resolve_prefix(tmp_path / "train", "en")


# --- tokenizer and prepare --------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """A few hundred synthetic pairs with known empty and overlong lines in train."""
    root = tmp_path_factory.mktemp("corpus")
    src, tgt = _sentences(300, 1), _sentences(300, 2)
    src[5], tgt[9], tgt[11] = "", "   ", ""  # 3 empty pairs
    long_line = " ".join(WORDS * 4)  # 64 words: far over max length 40 in tokens
    src[20], tgt[30] = long_line, long_line  # 2 overlong pairs
    paths = {"train": (root / "train.de", root / "train.en")}
    for path, lines in zip(paths["train"], (src, tgt)):
        _write(path, "\n".join(lines) + "\n")
    for split, seed in (("valid", 3), ("test", 4)):
        paths[split] = (root / f"{split}.de", root / f"{split}.en")
        v_src, v_tgt = _sentences(20, seed), _sentences(20, seed + 10)
        v_src[0] = ""  # kept: valid/test are scored line by line against references
        for path, lines in zip(paths[split], (v_src, v_tgt)):
            _write(path, "\n".join(lines) + "\n")
    return {"paths": paths, "src": src, "tgt": tgt}


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("prepared") / "data"
    p = corpus["paths"]
    report = prepare(out, p["train"], p["valid"], p["test"], vocab_size=100, max_src_len=40, max_tgt_len=40)
    return out, report


def test_prepare_writes_all_files(prepared):
    out, _ = prepared
    names = ["tokenizer.model", "prepare.json"]
    names += [f"{s}.safetensors" for s in ("train", "valid", "test")]
    names += [f"{s}.{side}.txt" for s in ("train", "valid", "test") for side in ("src", "tgt")]
    assert all((out / n).is_file() for n in names)
    assert not list(out.glob(".*.tmp"))  # no leftovers of atomic writes
    meta = json.loads((out / "prepare.json").read_text())
    assert meta["settings"]["joint"] is True and meta["settings"]["max_src_len"] == 40


def test_prepare_drop_counts(prepared):
    out, report = prepared
    train = report.splits["train"]
    assert (train.kept, train.dropped_empty, train.dropped_too_long) == (295, 3, 2)
    assert len(load_split(out, "train")) == 295
    assert report.splits["valid"].kept == len(load_split(out, "valid")) == 20
    assert "295 kept, 5 dropped (3 empty, 2 too long)" in report.summary()


def test_prepared_train_respects_length_caps(prepared):
    split = load_split(prepared[0], "train")
    assert split.src_lens.max() <= 40 and split.tgt_lens.max() <= 40
    assert split.src_lens.min() >= 1 and split.tgt_lens.min() >= 1


def test_prepared_valid_text_copy_keeps_every_line(prepared, corpus):
    out, _ = prepared
    assert read_lines(out / "valid.src.txt") == read_lines(corpus["paths"]["valid"][0])


def test_prepared_train_text_is_the_kept_pairs_in_the_order_of_train_safetensors(prepared):
    out, _ = prepared
    split, (src_tok, tgt_tok) = load_split(out, "train"), load_tokenizers(out)
    src, tgt = read_lines(out / "train.src.txt"), read_lines(out / "train.tgt.txt")
    assert len(src) == len(tgt) == len(split) == 295
    again = EncodedSplit.from_pairs(src_tok.encode(src), tgt_tok.encode(tgt))
    for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets"):
        np.testing.assert_array_equal(getattr(again, name), getattr(split, name))


def test_bpe_dropout_draws_other_segmentations_of_the_same_text(prepared):
    out, _ = prepared
    tok, _ = load_tokenizers(out)
    text = read_lines(out / "train.src.txt")
    plain = tok.encode(text)
    first, second = tok.encode(text, dropout=0.3), tok.encode(text, dropout=0.3)
    assert tok.decode(first) == tok.decode(plain) == text  # lossless: only the pieces change
    assert first != plain and first != second
    assert sum(map(len, first)) > sum(map(len, plain))  # skipped merges leave more, shorter pieces
    resegmented = resegment_train(out, tok, tok, 0.3)
    assert len(resegmented) == len(plain) and tok.decode([list(resegmented.pair(i)[0]) for i in range(5)]) == text[:5]


def test_bpe_dropout_needs_the_training_text_and_a_bpe_model(corpus, tmp_path):
    p = corpus["paths"]
    out = tmp_path / "unigram"
    prepare(out, p["train"], vocab_size=100, model_type="unigram")
    tok, _ = load_tokenizers(out)
    with pytest.raises(ConfigError, match="needs a BPE tokenizer.*unigram"):
        resegment_train(out, tok, tok, 0.1)
    out = tmp_path / "bpe"
    prepare(out, p["train"], vocab_size=100)
    (out / "train.tgt.txt").unlink()  # as in a folder prepared before the text was kept
    with pytest.raises(DataError, match=r"train\.tgt\.txt: missing.*prepare the folder again"):
        resegment_train(out, tok, tok, 0.1)


def test_prepare_refuses_overwrite_without_force(prepared, corpus):
    out, _ = prepared
    with pytest.raises(AttnkitError, match="already exists"):
        prepare(out, corpus["paths"]["train"], vocab_size=100)


def test_prepare_with_force_replaces_outputs(corpus, tmp_path):
    out, p = tmp_path / "data", corpus["paths"]
    prepare(out, p["train"], p["valid"], vocab_size=100)
    prepare(out, p["train"], vocab_size=100, joint=False, force=True)
    assert (out / "src.model").is_file() and (out / "tgt.model").is_file()
    assert not (out / "tokenizer.model").exists() and not (out / "valid.safetensors").exists()
    src_tok, tgt_tok = load_tokenizers(out)
    assert src_tok is not tgt_tok


def _contents(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def test_prepare_force_swaps_the_folder_in_whole_and_leaves_nothing_beside(corpus, tmp_path):
    """The new folder is built beside and renamed into place: afterwards only the data folder is there, holding
    the new outputs alone."""
    out, p = tmp_path / "data", corpus["paths"]
    prepare(out, p["train"], p["valid"], p["test"], vocab_size=100)
    prepare(out, p["train"], vocab_size=100, joint=False, force=True)
    assert [f.name for f in tmp_path.iterdir()] == ["data"]
    assert set(_contents(out)) == {"src.model", "tgt.model", "prepare.json", "train.safetensors", "train.src.txt",
                                   "train.tgt.txt"}


def test_prepare_force_refuses_a_folder_holding_other_files(corpus, tmp_path):
    """--force replaces the folder whole, so a file prepare did not write there would be lost with it: refused in
    one line naming it, the folder as it was."""
    out, p = tmp_path / "data", corpus["paths"]
    prepare(out, p["train"], vocab_size=100)
    (out / "notes.txt").write_text("mine\n", encoding="utf-8")
    before = _contents(out)
    with pytest.raises(DataError, match=r"^data folder '.*data' holds files prepare did not write \(notes\.txt\); "
                                        r"--force would replace the folder whole"):
        prepare(out, p["train"], vocab_size=100, force=True)
    assert _contents(out) == before


def test_lm_prepare_refuses_conflicting_requests_in_one_line(tmp_path, capsys, monkeypatch):
    """`lm prepare` refuses what it would otherwise ignore: --valid with --valid-fraction (two validation texts),
    --level other than the level of --vocab-from's vocabulary, and an --out that is a file (with --force too,
    which used to end in a FileExistsError traceback); the level of --vocab-from alone, or given alike, is fine."""
    import attnkit.checkpoint
    from attnkit.cli.main import main
    from attnkit.data.lm import LMVocab, load_lm_corpus

    text = _write(tmp_path / "text.txt", "the cat sat\nthe dog ran\n" * 20)
    existing = _write(tmp_path / "existing", "a file\n")

    def refused(*argv: str) -> str:
        capsys.readouterr()
        assert main(["lm", "prepare", *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, err
        return err

    assert refused("--train", str(text), "--out", str(existing), "--force") == \
        f"attnkit: error: output folder '{existing}' is a file, not a folder\n"
    assert existing.read_text() == "a file\n"
    err = refused("--train", str(text), "--valid", str(text), "--valid-fraction", "0.1", "--out", str(tmp_path / "a"))
    assert err == (f"attnkit: error: --valid {text} and --valid-fraction 0.1 both give the validation text: "
                   "give one\n")
    vocab = LMVocab.build(["the cat sat"], "word")
    monkeypatch.setattr(attnkit.checkpoint, "lm_vocab_of", lambda path: vocab)  # a model's vocabulary, word-level
    err = refused("--vocab-from", "model.safetensors", "--valid", str(text), "--level", "char", "--out",
                  str(tmp_path / "b"))
    assert err == ("attnkit: error: --level char, but the vocabulary given (--vocab-from) is word-level and decides "
                   "the level: drop --level\n")
    assert not any((tmp_path / name).exists() for name in ("a", "b"))
    for extra, name in (([], "c"), (["--level", "word"], "d")):
        assert main(["lm", "prepare", "--vocab-from", "m", "--valid", str(text), *extra, "--out",
                     str(tmp_path / name)]) == 0
        assert load_lm_corpus(tmp_path / name).vocab.level == "word"


def test_tokenizer_round_trip_and_special_ids(prepared, corpus):
    src_tok, tgt_tok = load_tokenizers(prepared[0])
    assert src_tok is tgt_tok
    texts = [s for s in corpus["src"][:50] if s]
    ids = src_tok.encode(texts)
    assert src_tok.decode(ids) == texts
    assert all(BOS_ID not in row and EOS_ID not in row for row in ids)
    assert src_tok.pieces([PAD_ID, BOS_ID, EOS_ID, UNK_ID]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert UNK_ID in src_tok.encode(["€"])[0]  # a character never seen in training


def test_decode_cuts_at_eos_and_drops_pad_bos(prepared):
    tok, _ = load_tokenizers(prepared[0])
    ids = tok.encode(["the cat sat", "the dog"])
    batch = [[BOS_ID, *ids[0], EOS_ID, *ids[1], PAD_ID], [*ids[1], PAD_ID, PAD_ID]]
    assert tok.decode(batch) == ["the cat sat", "the dog"]


def test_tokenizer_bytes_round_trip_and_bad_vocab(tmp_path):
    tok = SubwordTokenizer.train(_sentences(100, 0), vocab_size=60)
    again = SubwordTokenizer.from_bytes(tok.to_bytes())
    assert again.vocab_size == tok.vocab_size and again.encode(["the cat"]) == tok.encode(["the cat"])
    tok.save(tmp_path / "t.model")
    assert SubwordTokenizer.load(tmp_path / "t.model").to_bytes() == tok.to_bytes()
    with pytest.raises(ConfigError):
        SubwordTokenizer.train(["a b"], vocab_size=4)
    with pytest.raises(DataError):
        SubwordTokenizer.load(_write(tmp_path / "junk.model", b"not a model"))


# --- EncodedSplit -----------------------------------------------------------------------------


def test_encoded_split_save_load_round_trip(tmp_path):
    src, tgt = [[5, 6, 7], [], [8]], [[9], [10, 11], [12, 13, 14, 15]]
    split = EncodedSplit.from_pairs(src, tgt)
    split.save(tmp_path / "s.safetensors")
    loaded = EncodedSplit.load(tmp_path / "s.safetensors")
    assert len(loaded) == 3
    for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(split, name))
    assert [loaded.pair(i)[0].tolist() for i in range(3)] == src
    assert [loaded.pair(i)[1].tolist() for i in range(3)] == tgt
    assert loaded.tgt_lens.tolist() == [1, 2, 4]


def test_encoded_split_load_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="no such file: .*gone.safetensors"):
        EncodedSplit.load(tmp_path / "gone.safetensors")
    with pytest.raises(DataError, match="junk.safetensors"):
        EncodedSplit.load(_write(tmp_path / "junk.safetensors", b"\x00" * 20))


# --- collate ----------------------------------------------------------------------------------


def test_collate_shift_padding_and_counts():
    pairs = [(np.array([5, 6, 7]), np.array([8, 9])), (np.array([5]), np.array([10, 11, 12]))]
    batch = collate(pairs, [4, 7])
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID], [BOS_ID, 10, 11, 12]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.tgt_pad_mask.tolist() == [[False, False, False, True], [False] * 4]
    assert batch.src_pad_mask.tolist() == [[False] * 4, [False, False, True, True]]
    assert batch.n_tokens == 7 and batch.n_src_tokens == 6
    assert batch.indices.tolist() == [4, 7] and len(batch) == 2
    assert all(t.dtype == torch.long for t in (batch.src, batch.tgt_in, batch.tgt_out, batch.indices))
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out)


def test_iterate_batches_follows_index_lists():
    split = EncodedSplit.from_pairs([[5], [6, 6], [7]], [[8], [9], [10, 10]])
    batches = list(iterate_batches(split, [[2, 0], [1]]))
    assert [b.indices.tolist() for b in batches] == [[2, 0], [1]]
    assert batches[0].tgt_out.tolist() == [[10, 10, EOS_ID], [8, EOS_ID, PAD_ID]]


# --- TokenBatchSampler ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, size=3000), rng.integers(1, 60, size=3000)
    src[:3] = 500  # over-long examples: each must form a batch of its own
    return src, tgt


def _padded_cost(batch: list[int], src: np.ndarray, tgt: np.ndarray) -> int:
    return len(batch) * max(src[batch].max() + 1, tgt[batch].max() + 1)  # source + EOS, target + BOS/EOS


def test_sampler_covers_each_example_once_within_budget(lengths):
    src, tgt = lengths
    batches = TokenBatchSampler(src, tgt, max_tokens=400, seed=1).batches(epoch=0)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(src)))
    for b in batches:
        assert _padded_cost(b, src, tgt) <= 400 or len(b) == 1
    assert sum(len(b) == 1 and src[b[0]] == 500 for b in batches) == 3


def test_sampler_is_deterministic_per_seed_and_epoch(lengths):
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, max_tokens=400, seed=1)
    assert sampler.batches(3) == TokenBatchSampler(src, tgt, max_tokens=400, seed=1).batches(3)
    assert sampler.batches(3) != sampler.batches(4)
    assert len(sampler) == len(sampler.batches(0))


def test_sampler_without_shuffle_is_length_sorted_and_fixed(lengths):
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, max_tokens=400, shuffle=False)
    batches = sampler.batches(0)
    assert batches == sampler.batches(5)
    flat = np.concatenate(batches)
    assert np.all(np.diff(src[flat]) >= 0)


def test_sampler_rank_shares_disjoint_and_equal(lengths):
    src, tgt = lengths
    shares = [TokenBatchSampler(src, tgt, 400, seed=2, rank=r, world_size=3).batches(1) for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    seen = [i for share in shares for b in share for i in b]
    assert len(seen) == len(set(seen))
    n_all = len(TokenBatchSampler(src, tgt, 400, seed=2).batches(1))
    assert len(shares[0]) == n_all // 3


def test_sampler_covers_a_multi30k_sized_epoch_once_within_budget():
    """Every example exactly once, every batch within the padded budget (its speed is a benchmark:
    benchmarks/sampler_speed.py, not a wall-clock assertion that fails on a loaded machine)."""
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(5, 40, size=29_000), rng.integers(5, 40, size=29_000)
    batches = TokenBatchSampler(src, tgt, max_tokens=4096).batches(0)
    seen = np.concatenate([np.asarray(b) for b in batches])
    assert np.array_equal(np.sort(seen), np.arange(29_000))
    cost = np.maximum(src, tgt) + 1  # source + EOS, target + BOS/EOS
    assert all(len(b) * cost[b].max() <= 4096 for b in batches)


def test_sampler_rejects_bad_options():
    with pytest.raises(ConfigError):
        TokenBatchSampler(np.ones(3), np.ones(3), max_tokens=0)
    with pytest.raises(ConfigError):
        TokenBatchSampler(np.ones(3), np.ones(3), max_tokens=10, rank=2, world_size=2)


# --- demo corpus ------------------------------------------------------------------------------


def test_number_corpus_splits_disjoint_and_sized():
    corpus = make_number_corpus(n_train=300, n_valid=50, n_test=40, max_number=5000, seed=3)
    assert {k: len(v[0]) for k, v in corpus.items()} == {"train": 300, "valid": 50, "test": 40}
    assert all(len(de) == len(en) for de, en in corpus.values())
    sets = {k: set(zip(*v)) for k, v in corpus.items()}
    assert not sets["train"] & sets["valid"] and not sets["train"] & sets["test"]
    assert not sets["valid"] & sets["test"]
    assert {("null", "zero"), ("einundzwanzig", "twenty-one"), ("einhundert", "one hundred")} <= sets["train"]


def test_every_magnitude_is_drawn_in_even_shares():
    """Hundreds, thousands, ten and hundred thousands: the same share of dev and test each, and of train
    beyond the building blocks 0..100 (the small bands are full before the large ones)."""
    from attnkit.data.demo_corpus import EXAMPLES, _draw_numbers, magnitude_bands, spread

    assert magnitude_bands(999_999) == [(101, 999), (1000, 9999), (10_000, 99_999), (100_000, 999_999)]
    assert spread(10, [2, 100, 100]) == [2, 4, 4] and spread(7, [5, 5]) == [3, 4]
    numbers = _draw_numbers(24_000, 1000, 1000, 999_999, seed=0)
    digits = {k: np.bincount([len(str(n)) for n in v], minlength=7).tolist() for k, v in numbers.items()}
    assert digits["test"] == digits["valid"] == [0, 0, 0, 250, 250, 250, 250]
    assert digits["train"] == [0, 10, 90, 400, 7833, 7833, 7834]  # 0..100, then 399 of 101..999, then thirds
    assert set(EXAMPLES) <= set(numbers["test"].tolist())  # the README's examples are test sentences
    with pytest.raises(ConfigError, match="cannot draw that many"):
        spread(11, [5, 5])


def test_number_corpus_is_seeded_and_validated():
    kw = dict(n_train=150, n_valid=10, n_test=10, max_number=1000)
    assert make_number_corpus(seed=1, **kw) == make_number_corpus(seed=1, **kw)
    assert make_number_corpus(seed=1, **kw) != make_number_corpus(seed=2, **kw)
    with pytest.raises(ConfigError):
        make_number_corpus(n_train=50, n_valid=1, n_test=1)
    with pytest.raises(ConfigError):
        make_number_corpus(n_train=150, n_valid=100, n_test=100, max_number=200)


def test_write_number_corpus_files(tmp_path):
    paths = write_number_corpus(tmp_path, n_train=120, n_valid=5, n_test=5, max_number=1000)
    de, en = read_parallel(*paths["valid"])
    assert len(de) == len(en) == 5
    assert paths["train"][0].name == "train.de" and paths["test"][1].name == "test.en"


# --- real corpus ------------------------------------------------------------------------------


def test_multi30k_validation_reads():
    if not (MULTI30K / "val.de.gz").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    de, en = read_parallel(MULTI30K / "val.de.gz", MULTI30K / "val.en.gz")
    assert len(de) == len(en) == 1014


def test_atomic_writes_replace_whole_files_with_the_usual_permissions(tmp_path):
    import os

    from attnkit.io import atomic_write_text

    target = tmp_path / "out.txt"
    target.write_text("old")
    atomic_write_text(target, "new")
    mask = os.umask(0)
    os.umask(mask)
    assert target.read_text() == "new" and not list(tmp_path.glob(".*.tmp"))
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
