"""Reading a pickle without running anything it names (Python's "restricting globals" recipe).

A pickle builds objects by calling the functions and classes it names, which is how a pickle file runs code. This
reader builds only plain data: the builtin containers, strings and numbers, and `collections`' OrderedDict, Counter
and defaultdict (with an inert factory). Every other name (a class of the program that wrote the file: a
tokenizer, sacremoses' objects, `re.compile`'s patterns) becomes an inert `Placeholder` that keeps the arguments and
state the pickle gives it and does nothing else. So a Hugging Face TransfoXLTokenizer's vocab.pkl, which pickles the
tokenizer's whole `__dict__`, yields its `idx2sym` list without sacremoses installed and without running its code.
`torch_load` reads a torch.save file the same way, allowing besides only torch's own functions that rebuild a tensor
from its storage: a fairseq checkpoint, which pickles argparse.Namespace and fairseq's own classes beside its
tensors (torch's weights-only loader refuses those), yields its tensors and its settings as plain data.
The files are still pickles, so attnkit reads them only when the user trusts them (`--trust-checkpoint`).
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
import types
from typing import Any

import torch

_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool", "bytes", "bytearray",
             "complex")


class Placeholder:
    """An object of a class (or the result of a function) this reader does not build: its arguments and state."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:
        obj = super().__new__(cls)
        obj.args, obj.state = args, None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _placeholder_class(name: str) -> type:
    return type(name.replace(".", "_"), (Placeholder,), {})


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _BUILTINS:
            return getattr(builtins, name)
        if module == "collections" and name in ("OrderedDict", "Counter"):
            return getattr(collections, name)
        if module == "collections" and name == "defaultdict":
            return lambda factory=None, *rest: collections.defaultdict(None, *rest)  # noqa: ARG005 - factory dropped
        return _placeholder_class(f"{module}.{name}")


class _Unpickler(_Restricted):
    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to data outside the pickle (a torch.save file?)")


# What rebuilds a tensor or a Parameter from the storage torch's loader hands over (its storage types torch's loader
# maps itself); nothing else of torch is callable from the file.
_TORCH = {("torch._utils", name) for name in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter")}


class _TorchUnpickler(_Restricted):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _TORCH:
            return getattr(torch._utils, name)
        return super().find_class(module, name)


# torch.load's `pickle_module`: its Unpickler (subclassed by torch to supply the storages) and `load` (the old format)
_TORCH_PICKLE = types.SimpleNamespace(__name__="attnkit_inert_pickle", Unpickler=_TorchUnpickler,
                                      load=lambda f, **kw: _TorchUnpickler(f, **kw).load())


def loads(data: bytes) -> Any:
    """The object a pickle holds, built from plain data only (see the module docstring)."""
    return _Unpickler(io.BytesIO(data)).load()


def torch_load(path: str | os.PathLike) -> Any:
    """The object a torch.save file holds, tensors on the CPU, every other class a `Placeholder` (module docstring).
    torch's weights_only=False is its way to take a pickle_module; this one runs nothing the file names."""
    return torch.load(path, map_location="cpu", pickle_module=_TORCH_PICKLE, weights_only=False)


def state_of(obj: Any) -> dict:
    """The attribute dict of an object the pickle held, a dict itself or a Placeholder's state; {} otherwise."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, Placeholder) and isinstance(obj.state, dict):
        return obj.state
    return {}


__all__ = ["Placeholder", "loads", "state_of", "torch_load"]
