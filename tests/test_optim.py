"""FusedAdamW against torch.optim.AdamW(fused=True), the oracle: the same updates bit for bit, state dicts that
move between the two either way, and a training run that never imports torch's compiler."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch

from attnkit.cpu import FusedAdamW
from attnkit.train.base import decay_groups
from attnkit.train.optim import adamw
from conftest import tiny_model_config


def _model(seed: int = 0) -> torch.nn.Module:
    from attnkit.models import Transformer

    torch.manual_seed(seed)
    return Transformer(tiny_model_config())


def _grads(model: torch.nn.Module, step: int) -> None:
    """Gradients drawn from `step`; on odd steps the first parameter has none (it must be left alone)."""
    gen = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(model.parameters()):
        p.grad = None if (i == 0 and step % 2) else torch.randn(p.shape, generator=gen)


def _step(opt, model: torch.nn.Module, step: int) -> None:
    _grads(model, step)
    for group in opt.param_groups:
        group["lr"] = 1e-3 * (step + 1)  # a schedule, as the trainer sets it before every step
    opt.step()


def _pair(weight_decay: float = 0.01):
    ours, theirs = _model(), _model()
    kw = dict(lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    return (ours, FusedAdamW(decay_groups(ours, weight_decay, decay_vectors=False), **kw),
            theirs, torch.optim.AdamW(decay_groups(theirs, weight_decay, decay_vectors=False), fused=True, **kw))


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(x, y), name


def test_updates_equal_torch_fused_adamw_bit_for_bit():
    ours, opt, theirs, ref = _pair()
    assert len(opt.param_groups) == 2  # matrices decayed, vectors not
    for step in range(6):
        _step(opt, ours, step)
        _step(ref, theirs, step)
        _assert_same(ours, theirs)
    first = next(ours.parameters())
    assert opt.state[first]["step"].item() == 3  # it had a gradient on 3 of the 6 steps
    ref_state = ref.state_dict()
    our_state = opt.state_dict()
    assert our_state["param_groups"] == ref_state["param_groups"]
    for i, entry in ref_state["state"].items():
        for key, value in entry.items():
            assert torch.equal(our_state["state"][i][key], value), (i, key)


def test_state_dicts_move_between_the_two_either_way():
    ours, opt, theirs, ref = _pair()
    for step in range(3):
        _step(opt, ours, step)
        _step(ref, theirs, step)
    # torch's state into a fresh FusedAdamW and ours into a fresh torch AdamW, each over copies of the weights
    ours2, theirs2 = _model(), _model()
    ours2.load_state_dict(theirs.state_dict())
    theirs2.load_state_dict(ours.state_dict())
    kw = dict(lr=0.0, betas=(0.5, 0.5), eps=1.0)  # the loaded hyper-parameters must win over these
    opt2 = FusedAdamW(decay_groups(ours2, 0.5, decay_vectors=False), **kw)
    ref2 = torch.optim.AdamW(decay_groups(theirs2, 0.5, decay_vectors=False), fused=True, **kw)
    opt2.load_state_dict(copy.deepcopy(ref.state_dict()))  # copies, as from a checkpoint's file: a load keeps the
    ref2.load_state_dict(copy.deepcopy(opt.state_dict()))  # tensors it is given (torch's does too)
    for step in range(3, 6):
        for o, m in ((opt, ours), (ref, theirs), (opt2, ours2), (ref2, theirs2)):
            _step(o, m, step)
    _assert_same(ours2, theirs)
    _assert_same(theirs2, ours)
    _assert_same(ours, theirs)


def test_a_state_of_other_parameter_groups_is_refused():
    ours, opt, _, _ = _pair()
    _step(opt, ours, 0)
    single = FusedAdamW([{"params": list(_model().parameters())}], lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    with pytest.raises(ValueError, match="parameter groups of"):
        single.load_state_dict(opt.state_dict())


def test_zero_grad_and_the_choice_by_device():
    ours, opt, _, _ = _pair()
    _grads(ours, 0)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in ours.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in ours.parameters())
    groups = [{"params": list(ours.parameters())}]
    assert isinstance(adamw(groups, lr=0.0, betas=(0.9, 0.98), eps=1e-9, device=torch.device("cpu")), FusedAdamW)
    assert isinstance(adamw(groups, lr=0.0, betas=(0.9, 0.98), eps=1e-9, device=torch.device("meta")),
                      torch.optim.AdamW)


def test_training_never_imports_the_compiler(data_dir, tmp_path):
    """torch.optim imports torch._dynamo and sympy (72 MiB resident); `attnkit train` must not, through any path
    of a run: the precision probe, steps, evaluation, checkpoints, the report."""
    code = textwrap.dedent(f"""
        import sys
        from attnkit.cli.main import main
        rc = main(["train", "--data", {str(data_dir)!r}, "--out", {str(tmp_path / "run")!r}, "--quiet",
                   "--train.max_steps=3", "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32",
                   "--train.max_tokens=256", "--train.eval_max_sentences=8", "--train.device=cpu"])
        assert rc == 0, rc
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
