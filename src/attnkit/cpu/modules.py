"""Swapping a model's modules for the CPU room's, as `torch.ao.quantization.quantize_dynamic` swaps nn.Linear for
its quantised one: the new module holds the old one's own Parameters (the same tensors, the same state dict)."""

from __future__ import annotations

import copy
from collections.abc import Callable

from torch import nn

Swap = Callable[[nn.Module], nn.Module | None]  # a module -> its replacement, or None to keep it


def sharing(cls: type[nn.Module], module: nn.Module, **attributes) -> nn.Module:
    """An instance of `cls` (a subclass of module's class) holding module's own parameters, buffers and children
    (the same tensors: no copy), plus `attributes`."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    new._parameters, new._buffers, new._modules = dict(module._parameters), dict(module._buffers), dict(module._modules)
    new.__dict__.update(attributes)
    return new


def structural_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every Parameter, buffer and hook with `model` (swapping its modules
    leaves `model` as it was; its weights and hooks are the model's own)."""
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    # the hooks too: the copy runs the model's own hooks (a hook may hold what cannot be copied, such as a lock)
    memo.update({id(hooks): hooks for m in model.modules() for name, hooks in vars(m).items() if "hooks" in name})
    return copy.deepcopy(model, memo)


def swap_modules(model: nn.Module, swap: Swap) -> list[tuple[nn.Module, str, nn.Module]]:
    """Replace, in place, every submodule of `model` for which `swap` gives a replacement, children before their
    parents (a replacement holds its already swapped children); returns (parent, name, old module) for each, what
    `restore` puts back."""
    done = []
    for name, child in list(model._modules.items()):
        if child is None:
            continue
        done += swap_modules(child, swap)
        new = swap(child)
        if new is not None:
            model._modules[name] = new
            done.append((model, name, child))
    return done


def restore(swapped: list[tuple[nn.Module, str, nn.Module]]) -> None:
    """Undo `swap_modules`, last first."""
    for parent, name, old in reversed(swapped):
        parent._modules[name] = old
