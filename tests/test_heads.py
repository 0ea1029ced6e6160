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
