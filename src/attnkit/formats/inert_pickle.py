"""Reading a pickle without running anything it names (Python's "restricting globals" recipe).

A pickle builds objects by calling the functions and classes it names, which is how a pickle file runs code. This
reader builds only plain data: the builtin containers, strings and numbers, and `collections`' OrderedDict, Counter
and defaultdict (with an inert factory). Every other name (a class of the program that wrote the file: a
tokenizer, sacremoses' objects, `re.compile`'s patterns) becomes an inert `Placeholder` that keeps the arguments and
state the pickle gives it and does nothing else. So a Hugging Face TransfoXLTokenizer's vocab.pkl, which pickles the
tokenizer's whole `__dict__`, yields its `idx2sym` list without sacremoses installed and without running its code.
The files are still pickles, so attnkit reads them only when the user trusts them (`--trust-checkpoint`).
"""

from __future__ import annotations

import builtins
import collections
import io
import pickle
from typing import Any

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


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _BUILTINS:
            return getattr(builtins, name)
        if module == "collections" and name in ("OrderedDict", "Counter"):
            return getattr(collections, name)
        if module == "collections" and name == "defaultdict":
            return lambda factory=None, *rest: collections.defaultdict(None, *rest)  # noqa: ARG005 - factory dropped
        return _placeholder_class(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to data outside the pickle (a torch.save file?)")


def loads(data: bytes) -> Any:
    """The object a pickle holds, built from plain data only (see the module docstring)."""
    return _Unpickler(io.BytesIO(data)).load()


def state_of(obj: Any) -> dict:
    """The attribute dict of an object the pickle held, a dict itself or a Placeholder's state; {} otherwise."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, Placeholder) and isinstance(obj.state, dict):
        return obj.state
    return {}


__all__ = ["Placeholder", "loads", "state_of"]
