"""`attnkit experiment heads`: one preset with several numbers of heads at equal d_model, on one budget."""

from __future__ import annotations

import csv

from attnkit.checkpoint import load_checkpoint
from attnkit.cli.main import main


def test_heads_trains_each_count_at_equal_d_model_and_tabulates_bleu(tmp_path, data_dir, capsys):
    out = tmp_path / "heads"
    argv = ["experiment", "heads", "--data", data_dir, "--out", out, "--heads", "1", "2", "4", "--minutes", "5",
            "--quiet", "--model.d_model=16", "--model.d_ff=32", "--model.n_encoder_layers=1",
            "--model.n_decoder_layers=1", "--train.max_steps=2", "--train.max_tokens=400", "--train.device=cpu",
            "--train.eval_bleu=false", "--max-len-b", "4"]
    assert main(argv) == 0, capsys.readouterr().err
    with open(out / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["heads"], r["head dim"], r["name"]) for r in rows] == [("1", "16", "heads-1"), ("2", "8", "heads-2"),
                                                                      ("4", "4", "heads-4")]
    assert len({r["parameters"] for r in rows}) == 1  # d_k = d_model / h: the same parameters
    assert all(r["dev_bleu"] != "" and r["test_bleu"] != "" and r["steps"] == "2" for r in rows)
    for h in (1, 2, 4):
        ckpt = load_checkpoint(out / f"heads-{h}" / "checkpoints" / "last.safetensors")
        assert ckpt.config.model.n_heads == h and ckpt.config.train.max_minutes == 5.0
    assert (out / "heads.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 4 | 4 | heads-4 |" in (out / "heads.md").read_text()
    assert main(["experiment", "heads", "--data", str(data_dir), "--out", str(out), "--heads", "3",
                 "--model.d_model=16"]) == 2
    assert "divide d_model 16" in capsys.readouterr().err


def test_parts_trains_each_row_for_the_same_updates_with_its_one_change(tmp_path, data_dir, capsys):
    """`attnkit experiment parts`: each row is the preset with exactly its part's switch, every row the same updates
    and no time limit."""
    from attnkit.experiments.rows import PARTS

    out, parts = tmp_path / "parts", ["paper", "no-residual", "no-ffn", "shared-qk", "no-scale", "no-positions"]
    argv = ["experiment", "parts", "--data", data_dir, "--out", out, "--parts", *parts, "--updates", "3", "--quiet",
            "--model.d_model=16", "--model.d_ff=32", "--model.n_heads=2", "--model.n_encoder_layers=1",
            "--model.n_decoder_layers=1", "--train.max_tokens=400", "--train.device=cpu", "--train.eval_bleu=false",
            "--max-len-b", "4"]
    assert main(argv) == 0, capsys.readouterr().err
    with open(out / "parts.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["part"], r["what changes"], r["steps"]) for r in rows] == [(p, PARTS[p][0], "3") for p in parts]
    paper = load_checkpoint(out / "paper" / "checkpoints" / "last.safetensors").config
    assert paper.train.max_minutes == 0 and paper.train.max_steps == 3
    for part in parts[1:]:
        config = load_checkpoint(out / part / "checkpoints" / "last.safetensors").config
        changed = {k for k, v in vars(config.model).items() if v != getattr(paper.model, k)}
        assert changed == {o.split("=")[0].removeprefix("model.") for o in PARTS[part][1]}, part
    assert (out / "parts.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["experiment", "parts", "--data", str(data_dir), "--out", str(out), "--updates", "3", "--minutes",
                 "2"]) == 2
    assert "the one budget" in capsys.readouterr().err


def test_ancestors_trains_each_row_as_its_preset_and_overrides_for_the_same_updates(tmp_path, data_dir, capsys):
    """`attnkit experiment ancestors`: each row is exactly its preset with its own overrides (after the shared ones),
    every row the same updates and no time limit; Luong's rows differ in the scoring function alone. The Transformer
    row takes other size overrides than the RNNs, so this run trains the RNN rows and checks the Transformer's
    preset apart."""
    from attnkit import config as cfgmod
    from attnkit.experiments.rows import ANCESTORS

    rows = [row for row in ANCESTORS if ANCESTORS[row][1] != "multi30k"]
    shared = ["--model.embed_dim=8", "--model.hidden=16", "--model.attention_dim=8", "--train.max_tokens=400",
              "--train.device=cpu", "--train.eval_bleu=false"]
    out = tmp_path / "ancestors"
    argv = ["experiment", "ancestors", "--data", data_dir, "--out", out, "--rows", *rows, "--updates", "2", "--quiet",
            *shared, "--max-len-b", "4"]
    assert main(argv) == 0, capsys.readouterr().err
    with open(out / "ancestors.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["row"], r["preset"], r["steps"]) for r in table] == [(row, ANCESTORS[row][1], "2") for row in rows]
    assert all(r["dev_bleu"] != "" and r["test_bleu"] != "" for r in table)
    models = {}
    for row in rows:
        config = load_checkpoint(out / row / "checkpoints" / "last.safetensors").config
        preset, own = ANCESTORS[row][1:]
        expected = cfgmod.resolve([preset], [o.removeprefix("--") for o in shared] + list(own))
        vocab = {k: v for k, v in vars(config.model).items() if k.endswith("_vocab_size")}  # set from the data
        assert vars(config.model) == {**vars(expected.model), **vocab}, row
        assert config.train.max_steps == 2 and config.train.max_minutes == 0
        models[row] = vars(config.model)
    luong = [models[row] for row in rows if row.startswith("luong-")]
    assert [m["score"] for m in luong] == ["dot", "general", "concat", "cosine"]
    assert all({k for k in m if m[k] != luong[0][k]} == {"score"} for m in luong[1:])
    assert models["hard-gumbel"]["estimator"] == "gumbel" and models["hard-reinforce"]["estimator"] == "reinforce"
    assert cfgmod.resolve([ANCESTORS["transformer"][1]]).model.kind == "transformer"
    assert (out / "ancestors.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["experiment", "ancestors", "--data", str(data_dir), "--out", str(out), "--updates", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert main(["experiment", "ancestors", "--data", str(data_dir), "--out", str(out), "--rows", "transformer",
                 "--model.hidden=8"]) == 2  # an RNN field among the shared overrides: the row it does not fit is named
    assert "transformer (multi30k): unknown config key 'model.hidden'" in capsys.readouterr().err
