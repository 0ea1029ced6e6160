"""Every output honours the umask: a checkpoint, a text, a JSON file, bytes, a folder and what is in it get the mode a
plain `open` (or `mkdir`) would give them, 0666 (0777) less the umask, and reading the umask leaves it as it was.

Each case runs in a subprocess that sets its own umask, so this test changes no state of the test process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Writes one output of every kind under the umask given as argv[1] and prints their modes and the umask after.
WRITER = r"""
import json, os, stat, sys
from pathlib import Path

import torch

from attnkit import config as cfgmod
from attnkit.checkpoint import Checkpoint, save_checkpoint
from attnkit.io import atomic_folder, atomic_open, atomic_write_bytes, atomic_write_json, atomic_write_text

mask, out = int(sys.argv[1], 8), Path(sys.argv[2])
os.umask(mask)
ckpt = Checkpoint("transformer", cfgmod.RunConfig(), {"w": torch.arange(6.0)}, {"src": b"spm"})
save_checkpoint(out / "ckpt.safetensors", ckpt)
save_checkpoint(out / "ckpt.safetensors", ckpt, backup=out / "prev.safetensors")  # a replaced one, and its backup
atomic_write_text(out / "a.txt", "text\n")
atomic_write_json(out / "a.json", {"k": 1})
atomic_write_bytes(out / "a.bin", b"\x00\x01")
with atomic_open(out / "b.csv") as f:
    f.write("a,b\n")
with atomic_folder(out / "folder") as tmp:
    (tmp / "inside.txt").write_text("x")
modes = {str(p.relative_to(out)): stat.S_IMODE(p.stat().st_mode) for p in sorted(out.rglob("*"))}
print(json.dumps({"modes": modes, "after": os.umask(0)}))
"""

# Reads the umask given as argv[1] both ways, then prints what it reads and what the umask is after.
READER = r"""
import json, os, sys

from attnkit.io import _umask_by_setting, _umask_from_status, process_umask

os.umask(int(sys.argv[1], 8))
print(json.dumps({"read": process_umask(), "by_setting": _umask_by_setting(),
                  "no_status": _umask_from_status("/nonexistent/status"), "after": os.umask(0)}))
"""


def run_python(script: str, *argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002], ids=lambda m: f"umask{m:03o}")
def test_every_output_honours_the_umask_checkpoints_included(tmp_path, mask):
    report = run_python(WRITER, oct(mask), str(tmp_path))
    files = {"ckpt.safetensors", "prev.safetensors", "a.txt", "a.json", "a.bin", "b.csv", "folder/inside.txt"}
    expected = {name: 0o666 & ~mask for name in files} | {"folder": 0o777 & ~mask}
    assert report["modes"] == expected  # no temp file left beside them either
    assert report["after"] == mask


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=lambda m: f"umask{m:03o}")
def test_the_umask_is_read_both_ways_and_left_as_it_was(mask):
    report = run_python(READER, oct(mask))
    assert report == {"read": mask, "by_setting": mask, "no_status": None, "after": mask}


def test_the_umask_is_read_from_the_status_file_where_there_is_one(tmp_path):
    from attnkit.io import _umask_from_status

    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nUmask:\t0027\nState:\tR (running)\n")
    assert _umask_from_status(status) == 0o027
    status.write_text("Name:\tpython3\nState:\tR (running)\n")  # a kernel before 4.7 has no Umask line
    assert _umask_from_status(status) is None
