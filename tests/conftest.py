"""Shared fixtures: tiny configs (d_model 16) and a tiny prepared corpus, so the suite runs in minutes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.bench.int8_families import apply_engine
from attnkit.config import RunConfig, TrainConfig, TransformerConfig
from attnkit.data import prepare, write_number_corpus

torch.set_num_threads(2)
apply_engine()  # tests/test_int8.py runs the int8 tests once per kernel family, each in a process of its own

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def serve_extra():
    """httpx, after a clean skip where a package of the `serve` extra (FastAPI, uvicorn, httpx, prometheus-client)
    is missing: the service and its tests need all four."""
    for name in ("fastapi", "uvicorn", "prometheus_client"):
        pytest.importorskip(name)
    return pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine its barriers cost seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def linear_rows(monkeypatch, training_only: bool = False) -> list[int]:
    """The row count of every product F.linear runs from now on (`training_only`: those that record gradients)."""
    seen, plain = [], torch.nn.functional.linear

    def spy(x, w, b=None):
        if torch.is_grad_enabled() or not training_only:
            seen.append(x.numel() // x.size(-1))
        return plain(x, w, b)
    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    return seen


def tiny_model_config(**kw) -> TransformerConfig:
    base = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                n_decoder_layers=2, dropout=0.0)
    return TransformerConfig(**{**base, **kw})


def tiny_run_config(**train) -> RunConfig:
    base = dict(max_tokens=256, lr=3e-3, schedule="inverse_sqrt", warmup=10, eval_bleu=False, max_epochs=2,
                log_every=5, device="cpu")
    return RunConfig(model=tiny_model_config(dropout=0.1), train=TrainConfig(**{**base, **train}))


@pytest.fixture(scope="session")
def corpus_files(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """German/English number words: 300 train, 30 dev, 30 test pairs."""
    return write_number_corpus(tmp_path_factory.mktemp("corpus"), n_train=300, n_valid=30, n_test=30)


@pytest.fixture(scope="session")
def trained(tmp_path_factory, corpus_files):
    """prepare -> train six steps through the CLI; returns (data dir, run dir)."""
    from attnkit.cli.main import main

    root = tmp_path_factory.mktemp("cli")
    prefix = Path(corpus_files["train"][0]).with_suffix("")
    assert main(["prepare", "--src", "de", "--tgt", "en", "--train", prefix, "--valid", prefix.parent / "valid",
                 "--test", prefix.parent / "test", "--vocab-size", "100", "--out", root / "data"]) == 0
    assert main(["train", "--data", root / "data", "--out", root / "run", "--quiet", "--train.max_steps=6",
                 "--model.d_model", "16", "--model.n_heads=2", "--model.d_ff=32", "--train.max_tokens=300",
                 "--train.device=cpu"]) == 0
    return root / "data", root / "run"


@pytest.fixture(scope="session")
def trained_checkpoint(trained) -> Path:
    """The last checkpoint of `trained`'s run."""
    return trained[1] / "checkpoints" / "last.safetensors"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, corpus_files) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "data"
    prepare(out, corpus_files["train"], corpus_files["valid"], corpus_files["test"], vocab_size=120)
    return out


LM_TEXT = "".join(f"{who}: the {what} is here.\n" for who in ("ANNA", "BEN") for what in ("cat", "sea", "king"))
LM_TINY = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=2", "train.tgt_len=8",
           "train.mem_len=8", "train.batch_size=2", "train.eval_batch_size=2", "train.device=cpu",
           "train.eval_interval=100", "train.log_every=1", "train.schedule=constant", "train.lr=0.01",
           "train.max_steps=2"]


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory, data_dir) -> dict[str, Path]:
    """A tiny trained checkpoint of every family with attention: the Transformer, rnn-bahdanau and rnn-hard on the
    number corpus, Transformer-XL and the vanilla LM on a character-level text."""
    from attnkit import config as cfgmod
    from attnkit.config import RNNConfig
    from attnkit.data.lm import prepare_lm
    from attnkit.train.lm_trainer import LMTrainer
    from attnkit.train.trainer import Trainer

    root = tmp_path_factory.mktemp("families")
    runs = {"transformer": tiny_run_config(max_steps=4, max_epochs=1, log_every=1)}
    for kind in ("rnn-bahdanau", "rnn-hard"):
        runs[kind] = RunConfig(model=RNNConfig(kind=kind, src_vocab_size=40, tgt_vocab_size=40, embed_dim=12,
                                               hidden=16),
                               train=TrainConfig(max_tokens=300, lr=3e-3, schedule="constant", eval_bleu=False,
                                                 max_steps=2, eval_max_sentences=4, device="cpu"))
    out = {}
    for kind, cfg in runs.items():
        Trainer(cfg, data_dir, root / kind, progress=False).fit()
        out[kind] = root / kind / "checkpoints" / "best.safetensors"
    (root / "text.txt").write_text(LM_TEXT * 4, encoding="utf-8")
    prepare_lm(root / "lmdata", root / "text.txt", level="char", valid_fraction=0.2)
    for kind, preset in (("transformer-xl", "lm-char-small-xl"), ("vanilla-lm", "lm-char-small-vanilla")):
        cfg = cfgmod.resolve([preset], LM_TINY, cls=cfgmod.LMRunConfig)
        LMTrainer(cfg, root / "lmdata", root / kind, progress=False).fit()
        out[kind] = root / kind / "checkpoints" / "best.safetensors"
    return out
