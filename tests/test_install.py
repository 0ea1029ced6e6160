"""The install: the Makefile and .ci/run fetch through the package clients only (no URL), an oracle venv sees the
packages of the interpreter `make` runs with (the README's own venv included), `make test` goes on to ruff,
lint-imports and pytest when an oracle cannot be built, and the package's license and Python versions agree with
LICENSE and the README."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str) -> subprocess.CompletedProcess:
    """`make -C ROOT ARGS`, free of an outer make's flags and overrides (the suite itself runs under `make test`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def run_python(python: Path, code: str) -> str:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def venv_with_a_probe(folder: Path, name: str) -> Path:
    """A venv (no pip: the oracle's own comes from ensurepip) holding a module `name` that no other environment has,
    standing for what only the user's venv holds, such as the README venv's torch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = Path(run_python(python, "import sysconfig; print(sysconfig.get_path('purelib'))"))
    (purelib / f"{name}.py").write_text(f"WHERE = {str(folder)!r}\n", encoding="utf-8")
    return python


def test_the_makefile_and_ci_fetch_through_the_package_clients_only():
    """Everything comes by package name (pip, apt-get): no URL in the Makefile or CI's script, whose download
    would bypass the clients' configuration."""
    for path in (ROOT / "Makefile", ROOT / ".ci" / "run"):
        urls = re.findall(r"https?://\S+", path.read_text(encoding="utf-8"))
        assert urls == [], f"{path.name}: {urls}"


@needs_make
@pytest.mark.slow
def test_an_oracle_venv_sees_the_packages_of_the_interpreter_make_runs_with(tmp_path):
    """Built from a venv (PY=...), the oracle imports what that venv holds; `venv --system-site-packages` gave it the
    base interpreter's packages instead, so from the README's venv the oracles missed torch. A later run from another
    interpreter (here the one running this test) moves the oracle over to that one's packages, torch included.
    TRANSFORMERS4_PACKAGES=pip keeps the oracle's own install to a package it already has: the pins are not what is
    checked here, and the test needs no registry."""
    user = venv_with_a_probe(tmp_path / "user-venv", "probe_of_the_user_venv")
    oracle = tmp_path / "oracles" / "t4"
    built = make(f"PY={user}", f"ORACLE={oracle}", "TRANSFORMERS4_PACKAGES=pip", f"{oracle}/bin/python")
    assert built.returncode == 0, built.stdout + built.stderr
    seen = run_python(oracle / "bin" / "python", "import probe_of_the_user_venv as p; print(p.WHERE)")
    assert seen == str(tmp_path / "user-venv")

    moved = make(f"PY={sys.executable}", f"ORACLE={oracle}", "oracle-transformers4")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    import torch

    assert run_python(oracle / "bin" / "python", "import torch; print(torch.__file__)") == torch.__file__
    gone = subprocess.run([str(oracle / "bin" / "python"), "-c", "import probe_of_the_user_venv"], capture_output=True)
    assert gone.returncode != 0


@needs_make
@pytest.mark.slow
def test_make_test_goes_on_to_lint_and_pytest_when_an_oracle_cannot_be_built(tmp_path):
    """Both oracles' folders lie under a plain file, so neither venv can be made: `make test` prints its one-line
    note and still runs ruff, lint-imports and pytest (ruff and pytest on this file alone), and its exit status is
    theirs. PIP=: leaves the install out, the environment being the one running this test."""
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    blocked = tmp_path / "a-file"
    done = make(f"PY={sys.executable}", "PIP=:", f"ORACLE={blocked}/t4", f"FAIRSEQ={blocked}/fs",
                "LINT_PATHS=tests/test_install.py", "PYTEST_ARGS=tests/test_install.py -k package_clients", "test")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    notes = [line for line in said.splitlines() if line.startswith("note: an oracle could not be built")]
    assert len(notes) == 1, said
    assert "ruff check" in said and "lint-imports" in said, said
    assert re.search(r"^1 passed", done.stdout, flags=re.M), said


def test_the_license_is_mit_in_pyproject_and_license():
    """pyproject's SPDX `license` names what LICENSE says, and the wheel carries that file."""
    assert PYPROJECT["project"]["license"] == "MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n") and "Copyright (c) the attnkit authors" in text


def test_the_python_versions_agree_in_pyproject_and_the_readme():
    """Every `Python :: 3.x` classifier satisfies `requires-python`, the lowest of them is its lower bound, and the
    README's Set up section states that version as the least supported."""
    requires = SpecifierSet(PYPROJECT["project"]["requires-python"])
    versions = [c.rsplit(" :: ", 1)[1] for c in PYPROJECT["project"].get("classifiers", [])
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions and all(v in requires for v in versions), (requires, versions)
    major, minor = min(tuple(map(int, v.split("."))) for v in versions)
    lowest = f"{major}.{minor}"
    assert f"{lowest}.0" in requires and f"{major}.{minor - 1}.99" not in requires, (requires, versions)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    set_up = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    assert f"Python {lowest} or newer" in set_up, set_up
