"""Without positions a Transformer cannot see order (issue 40): its attention maps permute with the tokens (the
states and the decoder's outputs: tests/test_positions.py), and `attnkit plot order`, which draws it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.checkpoint import Checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.config import EOS_ID, RunConfig, TrainConfig
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.errors import AttnkitError
from attnkit.models import Transformer
from attnkit.viz.order import plot_order_blindness, shuffle_order, unshuffled, with_positions
from conftest import tiny_model_config

PERMUTATIONS = 3


def model(positions: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_model_config(positions=positions, d_model=32, n_heads=4)).eval()


def sources() -> torch.Tensor:
    src = torch.randint(4, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    src[:, -1] = EOS_ID
    return src


def permutations(n: int):
    gen = torch.Generator().manual_seed(3)
    return [torch.randperm(n, generator=gen) for _ in range(PERMUTATIONS)]


def test_without_positions_every_attention_map_permutes_with_the_tokens():
    """P A P^T in every layer (test_positions.py checks the states and the decoder's outputs)."""
    m, src = model("none"), sources()
    with torch.no_grad():
        enc = m.encode(src, need_weights=True)
        for pi in permutations(src.size(1)):
            moved = m.encode(src[:, pi], need_weights=True)
            torch.testing.assert_close(moved.memory, enc.memory[:, pi], atol=1e-5, rtol=1e-5)
            for a, a_moved in zip(enc.attention, moved.attention):  # each layer: P A P^T, (B, H, S, S)
                torch.testing.assert_close(a_moved, a[:, :, pi][:, :, :, pi], atol=1e-6, rtol=1e-5)


def test_unshuffled_puts_every_weight_back_where_the_sentence_has_its_tokens():
    maps, order = torch.rand(2, 3, 5, 5), [3, 0, 4, 1, 2]  # shuffled position i holds the sentence's token order[i]
    back = unshuffled(maps, order)
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            assert torch.equal(back[..., a, b], maps[..., i, j])


def test_shuffles_move_the_words_keep_eos_last_and_follow_the_seed():
    for n in (3, 4, 9):
        for seed in range(5):
            order = shuffle_order(n, seed)
            assert sorted(order) == list(range(n)) and order[-1] == n - 1 and order != list(range(n))
            assert order == shuffle_order(n, seed)


def test_with_positions_keeps_every_weight_and_only_the_positions_change():
    learned = model("learned")
    for positions in ("none", "sinusoidal"):
        other = with_positions(learned, positions)
        assert other.config == dataclasses.replace(learned.config, positions=positions)
        mine = {k: v for k, v in learned.state_dict().items() if not k.startswith("positions.")}
        assert mine.keys() == other.state_dict().keys()
        assert all(torch.equal(v, other.state_dict()[k]) for k, v in mine.items())


def test_the_picture_shows_equal_maps_without_positions_and_other_maps_with_sinusoids(tmp_path):
    rng = torch.random.get_rng_state()
    plot = plot_order_blindness(tmp_path / "order.png", "the cat sat on the mat")
    assert torch.equal(torch.random.get_rng_state(), rng)  # the host's generator is left alone
    d = plot.data
    assert d["tokens"] == ["the", "cat", "sat", "on", "the", "mat", "</s>"] and (tmp_path / "order.png").exists()
    assert d["none_max_difference"] < 1e-6 < 1e-2 < d["sinusoidal_max_difference"]
    for name in ("none", "sinusoidal"):
        sentence, shuffle = d[f"{name}_maps"]
        assert sentence.shape == (7, 7) and abs(sentence.sum(-1) - 1).max() < 1e-5
    # the two "the" read the same row without positions (same token, same context), not with them
    assert abs(d["none_maps"][0][0] - d["none_maps"][0][4]).max() < 1e-6
    assert abs(d["sinusoidal_maps"][0][0] - d["sinusoidal_maps"][0][4]).max() > 1e-3


def test_plot_order_from_the_command_line_with_a_checkpoint(tmp_path, capsys):
    text = ["the cat sat on the mat", "a dog lay on a rug"] * 5
    tok = SubwordTokenizer.train(text, 40)
    config = tiny_model_config(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, positions="learned")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.safetensors", Checkpoint("transformer", RunConfig(model=config, train=TrainConfig()),
                                                           Transformer(config).state_dict(), {"src": tok.to_bytes()}))
    assert main(["plot", "order", "--checkpoint", str(tmp_path / "m.safetensors"), "--src", "the dog sat on a mat",
                 "--layer", "2", "--head", "2", "--out", str(tmp_path / "o.png")]) == 0
    out = capsys.readouterr().out
    assert "encoder layer 2, head 2" in out and "shuffle: " in out and (tmp_path / "o.png").exists()
    assert main(["plot", "order", "--head", "9", "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "the encoder has layers 1..2 (-1 the last) and heads 1..4" in err and not (tmp_path / "p.png").exists()


def test_a_model_that_is_not_a_transformer_is_refused(tmp_path):
    from attnkit import config as cfgmod

    save_checkpoint(tmp_path / "xl.safetensors", Checkpoint("transformer-xl", cfgmod.family("transformer-xl").run(),
                                                            {}, {}))
    with pytest.raises(AttnkitError, match="holds a 'transformer-xl' model"):
        plot_order_blindness(None, "a b c", checkpoint=tmp_path / "xl.safetensors")


def test_a_shaw_model_is_drawn_without_positions_and_with_its_own_relative_positions(tmp_path):
    shaw = model("shaw")
    assert with_positions(shaw, "shaw") is shaw
    bare = with_positions(shaw, "none")  # the relative tables left out, every other weight kept
    kept = {k: v for k, v in shaw.state_dict().items() if not k.endswith(("rel_keys", "rel_values"))}
    assert kept.keys() == bare.state_dict().keys() and len(kept) < len(shaw.state_dict())
    assert all(torch.equal(v, bare.state_dict()[k]) for k, v in kept.items())
    text = ["the cat sat on the mat", "a dog lay on a rug"] * 5
    tok = SubwordTokenizer.train(text, 40)
    config = tiny_model_config(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, positions="shaw")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "shaw.safetensors", Checkpoint(
        "transformer", RunConfig(model=config, train=TrainConfig()), Transformer(config).state_dict(),
        {"src": tok.to_bytes()}))
    d = plot_order_blindness(tmp_path / "o.png", "the dog sat on a mat", checkpoint=tmp_path / "shaw.safetensors").data
    assert d["compared"] == ("none", "shaw") and "sinusoidal_maps" not in d
    assert d["none_max_difference"] < 1e-6 < 1e-3 < d["shaw_max_difference"]
