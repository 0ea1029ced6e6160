"""`attnkit average` and `average_checkpoints` refuse checkpoints that are not one network on one vocabulary, in
one line naming the first file that differs and what differs; the ensemble's refusal is the same test."""

from __future__ import annotations

import pytest
import torch

from attnkit import config as cfgmod
from attnkit.checkpoint import Checkpoint, average_checkpoints, load_checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decode import Translator
from attnkit.errors import CheckpointError
from attnkit.models.transformer import Transformer
from conftest import tiny_model_config, tiny_run_config

WORDS = ["eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "elf", "zwölf"]


@pytest.fixture(scope="module")
def tokenizers() -> tuple[bytes, bytes]:
    """Two vocabularies learnt from different text: two prepared datasets."""
    first = SubwordTokenizer.train([" ".join(WORDS[i:] + WORDS[:i]) for i in range(12)], 30)
    second = SubwordTokenizer.train([" ".join(reversed(WORDS[i:])) + " hundert" for i in range(12)], 34)
    return first.to_bytes(), second.to_bytes()


def write(path, tokenizer: bytes, seed: int, **model) -> str:
    """A tiny Transformer checkpoint with its own random weights."""
    torch.manual_seed(seed)
    cfg = cfgmod.replace(tiny_run_config(), model=tiny_model_config(**model))
    save_checkpoint(path, Checkpoint("transformer", cfg, Transformer(cfg.model).state_dict(),
                                     {"src": tokenizer, "tgt": tokenizer}))
    return str(path)


def one_line_error(capsys, *argv) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnkit: error: "), err
    return err


def test_average_refuses_checkpoints_of_other_tokenizers(tmp_path, capsys, tokenizers):
    a = write(tmp_path / "a.safetensors", tokenizers[0], seed=1)
    b = write(tmp_path / "b.safetensors", tokenizers[0], seed=2)
    other = write(tmp_path / "other.safetensors", tokenizers[1], seed=3)  # the same network, another vocabulary
    err = one_line_error(capsys, "average", a, b, other, "--out", tmp_path / "avg.safetensors")
    assert f"{other} has other tokenizers than {a} (another 'src' tokenizer): cannot average them" in err
    assert not (tmp_path / "avg.safetensors").exists()
    with pytest.raises(CheckpointError, match="another 'src' tokenizer"):
        average_checkpoints([a, other], tmp_path / "avg.safetensors")
    # the ensemble refuses the same files with the same words: one test of "the same tokenizers"
    with pytest.raises(CheckpointError, match=r"other\.safetensors has other tokenizers than .*a\.safetensors "
                                              r"\(another 'src' tokenizer\): an ensemble's"):
        Translator.from_checkpoints([a, other], device="cpu")
    assert main(["average", a, b, "--out", tmp_path / "avg.safetensors"]) == 0  # one vocabulary: averaged
    avg, first, second = (load_checkpoint(p) for p in (tmp_path / "avg.safetensors", a, b))
    assert avg.tokenizers == first.tokenizers
    for name, tensor in avg.model_state.items():
        torch.testing.assert_close(tensor, (first.model_state[name] + second.model_state[name]) / 2)


def test_average_names_the_model_config_field_that_differs(tmp_path, capsys, tokenizers):
    a = write(tmp_path / "a.safetensors", tokenizers[0], seed=1)
    gelu = write(tmp_path / "gelu.safetensors", tokenizers[0], seed=2, activation="gelu")  # same tensors and shapes
    err = one_line_error(capsys, "average", a, gelu, "--out", tmp_path / "avg.safetensors")
    assert f"{gelu} holds another model than {a} (model.activation gelu, not relu): cannot average them" in err
    wider = write(tmp_path / "wide.safetensors", tokenizers[0], seed=2, d_ff=48)
    with pytest.raises(CheckpointError, match=r"\(model\.d_ff 48, not 32\): cannot average them"):
        average_checkpoints([a, wider], tmp_path / "avg.safetensors")
    # dropout changes how weights were trained, not what they compute: such checkpoints average
    dropout = write(tmp_path / "dropout.safetensors", tokenizers[0], seed=3, dropout=0.3)
    averaged = average_checkpoints([a, dropout], tmp_path / "avg.safetensors")
    assert averaged.config.model.dropout == 0.3  # the last one's config, as before
