"""Data-parallel training with torchrun + DDP (gloo on CPU): the same updates as one process, rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint

HERE = Path(__file__).resolve().parent
TINY = ["--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--model.n_encoder_layers=2",
        "--model.n_decoder_layers=2", "--model.dropout=0", "--model.attention_dropout=0",
        "--model.activation_dropout=0", "--train.max_tokens=100", "--train.lr=3e-3", "--train.warmup=4",
        "--train.schedule=inverse_sqrt", "--train.eval_bleu=false", "--train.device=cpu", "--train.log_every=1",
        "--train.keep_epochs=0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this torch has no gloo backend")


def train(data_dir: Path, out: Path, steps: int, *, ranks: int, accumulate: int, audit: Path | None = None,
          resume: bool = False) -> None:
    argv = ["train", "--data", str(data_dir), "--out", str(out), "--quiet", f"--train.max_steps={steps}",
            f"--train.accumulate={accumulate}", *TINY, *(["--resume"] if resume else [])]
    if ranks == 1:
        cmd = [sys.executable, "-m", "attnkit", *argv]
    else:
        audit = audit or out.with_name(out.name + "-audit")
        audit.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               str(HERE / "ddp_audit.py"), str(audit), *argv]
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.safetensors").model_state


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:  # the same sums in another order: float rounding apart
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_two_ranks_of_batch_b_update_like_one_rank_of_2b_and_only_rank_0_writes(tmp_path, data_dir):
    steps = 5
    train(data_dir, tmp_path / "ddp", steps, ranks=2, accumulate=1, audit=tmp_path / "audit")
    train(data_dir, tmp_path / "one", steps, ranks=1, accumulate=2)
    assert load_checkpoint(tmp_path / "ddp" / "checkpoints" / "last.safetensors").train_state["step"] == steps
    before = weights(tmp_path / "one")
    assert_same_weights(weights(tmp_path / "ddp"), before)

    run = str(tmp_path / "ddp")
    written = {r: [p for p in (tmp_path / "audit" / f"rank{r}.txt").read_text().splitlines() if p.startswith(run)]
               for r in (0, 1)}
    assert any(p.endswith("last.safetensors") for p in written[0]) and any("metrics.csv" in p for p in written[0])
    assert written[1] == [], f"rank 1 wrote {written[1][:5]}"


def test_a_run_resumes_on_another_number_of_processes(tmp_path, data_dir):
    train(data_dir, tmp_path / "straight", 6, ranks=1, accumulate=2)
    train(data_dir, tmp_path / "moved", 3, ranks=1, accumulate=2)
    train(data_dir, tmp_path / "moved", 6, ranks=2, accumulate=1, resume=True)
    assert load_checkpoint(tmp_path / "moved" / "checkpoints" / "last.safetensors").train_state["step"] == 6
    assert_same_weights(weights(tmp_path / "moved"), weights(tmp_path / "straight"))
