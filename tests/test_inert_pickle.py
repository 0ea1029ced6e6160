"""The pickle readers of attnkit.formats.inert_pickle build tensors and plain data and run nothing a file names."""

from __future__ import annotations

import argparse
import collections
import os
import pickle

import pytest
import torch

from attnkit.formats.inert_pickle import Placeholder, loads, state_of, torch_load


class Planted:
    """What a hostile pickle holds: unpickling it would call os.mkdir(path)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_pickle_of_plain_data_and_a_planted_call_builds_the_data_and_calls_nothing(tmp_path):
    planted = str(tmp_path / "ran")
    obj = loads(pickle.dumps({"symbols": ["<eos>", "the"], "counts": collections.Counter(a=2), "x": Planted(planted)}))
    assert obj["symbols"] == ["<eos>", "the"] and obj["counts"] == {"a": 2}
    assert isinstance(obj["x"], Placeholder) and obj["x"].args == (planted,) and not os.path.exists(planted)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_torch_load_builds_tensors_and_settings_and_calls_nothing(tmp_path, zipped):
    """A fairseq-like checkpoint: tensors (a Parameter among them) beside an argparse.Namespace and a planted call."""
    planted = str(tmp_path / "ran")
    weights = collections.OrderedDict(w=torch.arange(6.0).reshape(2, 3), p=torch.nn.Parameter(torch.ones(2)))
    torch.save({"model": weights, "args": argparse.Namespace(arch="transformer", encoder_layers=6),
                "extra": Planted(planted)}, tmp_path / "c.pt", _use_new_zipfile_serialization=zipped)
    obj = torch_load(tmp_path / "c.pt")
    torch.testing.assert_close(obj["model"]["w"], weights["w"])
    assert isinstance(obj["model"]["p"], torch.nn.Parameter)
    assert state_of(obj["args"]) == {"arch": "transformer", "encoder_layers": 6}
    assert isinstance(obj["extra"], Placeholder) and not os.path.exists(planted)
