"""AdamW through torch's fused kernel, without `torch.optim`'s import of the compiler.

Every method of `torch.optim.Optimizer`, its constructor included, imports `torch._dynamo` (and sympy with it) so
that optimizers can be compiled: resident memory that a training process that never compiles does not need
(`tests/test_optim.py` checks that training never imports it). `FusedAdamW` runs the same update through the same
kernel (`torch._fused_adamw_`, what `torch.optim.AdamW(fused=True)` calls), keeps the same state under the same
names and writes the same state dict, so a checkpoint's optimizer state moves between the two either way (the test
checks both ways, and the updates bit for bit). `attnkit.train.optim.adamw` picks it where the fused kernel runs
(CPU, CUDA) and `torch.optim.AdamW` elsewhere. `torch._fused_adamw_` is private: tests/test_private_torch.py checks
that its signature and update still match `torch.optim.AdamW`'s.
"""

from __future__ import annotations

from typing import Any

import torch

# What torch.optim.AdamW(fused=True) records in each parameter group beside lr, betas, eps and weight_decay
_FIXED = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
          "fused": True, "decoupled_weight_decay": True}
_HYPER = ("lr", "betas", "eps", "weight_decay")  # what a loaded state dict sets


class FusedAdamW:
    """AdamW (Loshchilov & Hutter 2019; with weight decay 0, Adam) over parameter groups, `{"params": [...],
    "weight_decay": wd}`; each step is one fused kernel call per group and (device, dtype). A parameter without a
    gradient is left alone and gets no state, as in torch."""

    def __init__(self, groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float], eps: float):
        self.param_groups = [{"weight_decay": g.get("weight_decay", 0.0), "lr": lr, "betas": tuple(betas), "eps": eps,
                              **_FIXED, "params": list(g["params"])} for g in groups]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for params, grads, avgs, squares, steps in self._buckets(group["params"]):
                torch._foreach_add_(steps, 1)
                torch._fused_adamw_(params, grads, avgs, squares, [], steps, amsgrad=False, lr=group["lr"],
                                    beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                    maximize=False)

    def _buckets(self, params: list[torch.Tensor]) -> list[tuple[list[torch.Tensor], ...]]:
        """(params, grads, exp_avgs, exp_avg_sqs, steps) of the parameters with a gradient, one per (device, dtype)."""
        buckets: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], ...]] = {}
        for p in params:
            if p.grad is None:
                continue
            s = self.state.get(p)
            if s is None:  # the first update with a gradient, as torch.optim makes the state
                s = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),  # the kernel's
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            for bucket, t in zip(buckets.setdefault((p.device, p.dtype), ([], [], [], [], [])),
                                 (p, p.grad, s["exp_avg"], s["exp_avg_sq"], s["step"])):
                bucket.append(t)
        return list(buckets.values())

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_().zero_()

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: parameters numbered in group order, their state under those numbers."""
        number: dict[int, int] = {}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [number.setdefault(id(p), len(number)) for p in g["params"]]} for g in self.param_groups]
        return {"state": {number[id(p)]: dict(s) for p, s in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A state dict of this class or of torch.optim.AdamW (fused or not) over the same parameter groups; like
        torch's, it keeps the tensors it is given where their device and dtype are already right."""
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"the optimizer state holds parameter groups of {[len(g['params']) for g in saved]} "
                             f"parameters, this model's are of {[len(g['params']) for g in self.param_groups]}")
        param = {i: p for old, group in zip(saved, self.param_groups) for i, p in zip(old["params"], group["params"])}
        for old, group in zip(saved, self.param_groups):
            group.update({k: tuple(old[k]) if k == "betas" else old[k] for k in _HYPER if k in old})
        self.state = {}
        for i, entry in state_dict["state"].items():
            p = param[int(i)]
            self.state[p] = {k: v.to(device=p.device, dtype=torch.float32 if k == "step" else p.dtype)
                             for k, v in entry.items()}
