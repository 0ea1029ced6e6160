"""`attnkit experiment compare / by-length` (issue 5): buckets, per-bucket BLEU, perplexity, tables and plots."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.cli.main import main
from attnkit.config import RNNConfig
from attnkit.data import BOS_ID, EOS_ID, load_split, load_tokenizers, read_lines
from attnkit.decode import Translator
from attnkit.eval import score_corpus
from attnkit.experiments.by_length import bucket_scores, length_buckets
from attnkit.experiments.compare import split_perplexity
from attnkit.experiments.tables import markdown_table
from attnkit.models import build_model

PNG = b"\x89PNG\r\n\x1a\n"


def test_explicit_edges_make_inclusive_buckets():
    lengths = list(range(1, 26))
    assert length_buckets(lengths, edges=[10, 20]) == [(1, 10), (11, 20), (21, 25)]
    assert length_buckets(lengths, edges=[20, 10, 40, 0]) == [(1, 10), (11, 20), (21, 25)]  # sorted, clipped
    assert length_buckets([4, 4, 4], n_buckets=3) == [(4, 4)]


@pytest.mark.parametrize("n_buckets", [1, 3, 4, 7])
def test_quantile_buckets_cover_every_sentence_once_with_similar_counts(n_buckets):
    lengths = [int(x) for x in torch.randint(1, 60, (200,), generator=torch.Generator().manual_seed(n_buckets))]
    buckets = length_buckets(lengths, n_buckets)
    assert len(buckets) <= n_buckets and buckets[0][0] == min(lengths) and buckets[-1][1] == max(lengths)
    for n in lengths:  # every length falls in exactly one bucket
        assert sum(lo <= n <= hi for lo, hi in buckets) == 1
    counts = [sum(lo <= n <= hi for n in lengths) for lo, hi in buckets]
    assert max(counts) - min(counts) <= 200 / n_buckets * 0.5  # about equal, up to ties


def test_bucket_bleu_is_corpus_bleu_of_the_bucket_sentences():
    refs = ["a small dog runs", "the cat sleeps", "two men play football in the park today", "red", "a b c d e f"]
    hyps = ["a small dog runs", "a cat sleeps", "two men play soccer in a park", "blue", "a b c d e g"]
    lengths = [4, 3, 8, 1, 6]
    scores = bucket_scores(lengths, hyps, refs, [(1, 4), (5, 8), (9, 12)])
    short = score_corpus([hyps[0], hyps[1], hyps[3]], [refs[0], refs[1], refs[3]])
    long = score_corpus([hyps[2], hyps[4]], [refs[2], refs[4]])
    assert [s["sentences"] for s in scores] == [3, 2, 0]
    assert scores[0]["bleu"] == short.bleu and scores[1]["bleu_lc"] == long.bleu_lc
    assert math.isnan(scores[2]["bleu"])


def test_markdown_table():
    text = markdown_table(["model", "parameters", "bleu"], [["rnn", 1234567, 12.3456], ["x", 3, float("nan")]])
    assert text.splitlines() == ["| model | parameters | bleu |", "|---|---|---|", "| rnn | 1,234,567 | 12.35 |",
                                 "| x | 3 |  |"]


def test_split_perplexity_against_sentence_by_sentence_scoring(data_dir):
    src_tok, _ = load_tokenizers(data_dir)
    torch.manual_seed(0)
    model = build_model("rnn-luong", RNNConfig(kind="rnn-luong", src_vocab_size=src_tok.vocab_size,
                                               tgt_vocab_size=src_tok.vocab_size, embed_dim=8, hidden=8)).eval()
    split = load_split(data_dir, "valid")
    logp, tokens = 0.0, 0
    for i in range(len(split)):
        src, tgt = (torch.as_tensor(a, dtype=torch.long) for a in split.pair(i))
        src = torch.cat([src, torch.tensor([EOS_ID])])[None]
        tgt_in = torch.cat([torch.tensor([BOS_ID]), tgt])[None]
        tgt_out = torch.cat([tgt, torch.tensor([EOS_ID])])[None]
        with torch.no_grad():
            logp += float(model(src, tgt_in).log_softmax(-1).gather(2, tgt_out[..., None]).sum())
        tokens += tgt_out.numel()
    assert math.isclose(split_perplexity(model, data_dir, "valid", max_tokens=64), math.exp(-logp / tokens),
                        rel_tol=1e-4)


@pytest.fixture(scope="module")
def compared(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("experiment") / "compare"
    argv = ["experiment", "compare", "--data", data_dir, "--out", out, "--models", "rnn-seq2seq", "rnn-bahdanau",
            "--minutes", "5", "--quiet", "--model.hidden=16", "--model.embed_dim=8", "--train.max_steps=2",
            "--train.max_tokens=400", "--train.device=cpu", "--train.eval_bleu=false", "--max-len-b", "4"]
    assert main(argv) == 0
    return out, argv


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_compare_trains_each_model_and_writes_table_and_plot(compared, data_dir):
    out, _ = compared
    rows = read_csv(out / "compare.csv")
    assert [r["name"] for r in rows] == ["rnn-seq2seq", "rnn-bahdanau"]
    assert [r["kind"] for r in rows] == ["rnn-seq2seq", "rnn-bahdanau"]
    for row in rows:
        ckpt = load_checkpoint(out / row["name"] / "checkpoints" / "best.safetensors")
        assert ckpt.config.train.max_minutes == 5.0 and ckpt.train_state["step"] == int(row["steps"]) == 2
        model = build_model(ckpt.kind, ckpt.config.model)
        assert int(row["parameters"]) == sum(p.numel() for p in model.parameters())
    # the bahdanau row's test BLEU, recomputed by hand from its best checkpoint
    translator = Translator.from_checkpoint(out / "rnn-bahdanau" / "checkpoints" / "best.safetensors", device="cpu")
    hyps = translator.translate_texts(read_lines(data_dir / "test.src.txt"), max_len_b=4)
    expected = score_corpus(hyps, read_lines(data_dir / "test.tgt.txt"))
    assert math.isclose(float(rows[1]["test_bleu"]), expected.bleu, abs_tol=1e-6)
    assert all(float(r["dev_ppl"]) > 1 and float(r["test_ppl"]) > 1 for r in rows)
    assert "| rnn-bahdanau | rnn-bahdanau |" in (out / "compare.md").read_text()
    assert (out / "compare.png").read_bytes()[:8] == PNG


def test_compare_never_retrains_silently(capsys, compared):
    out, argv = compared
    capsys.readouterr()
    assert main(argv) == 2
    assert "--reuse" in capsys.readouterr().err
    before = (out / "rnn-seq2seq" / "checkpoints" / "last.safetensors").stat().st_mtime_ns
    assert main([*argv, "--reuse"]) == 0
    assert (out / "rnn-seq2seq" / "checkpoints" / "last.safetensors").stat().st_mtime_ns == before


def test_by_length_writes_one_line_per_checkpoint(capsys, compared, data_dir, tmp_path):
    out, _ = compared
    seq = out / "rnn-seq2seq" / "checkpoints" / "best.safetensors"
    att = out / "rnn-bahdanau" / "checkpoints" / "best.safetensors"
    assert main(["experiment", "by-length", "--data", data_dir, "--checkpoints", seq, f"attention={att}",
                 "--out", tmp_path, "--buckets", "3", "--unit", "pieces", "--max-len-b", "4", "--device", "cpu"]) == 0
    rows = read_csv(tmp_path / "by_length.csv")
    assert list(rows[0]) == ["source pieces", "sentences", "rnn-seq2seq bleu", "rnn-seq2seq bleu_lc",
                             "attention bleu", "attention bleu_lc"]
    assert sum(int(r["sentences"]) for r in rows) == len(read_lines(data_dir / "test.src.txt"))
    assert 2 <= len(rows) <= 3 and (tmp_path / "by_length.png").read_bytes()[:8] == PNG  # one-word sentences
    assert "source pieces" in capsys.readouterr().out
    code = main(["experiment", "by-length", "--checkpoints", seq, "--out", tmp_path])
    assert code == 2 and "--data" in capsys.readouterr().err
