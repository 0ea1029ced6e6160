"""What identifies a model an experiment trained, so that a rerun never mixes runs of other settings.

Beside each model, OUT/<model>/identity.json records, when its training starts, the resolved run config (the
preset, the overrides and the budget folded into it) and a fingerprint of the prepared data it learns from. A rerun
reuses or resumes that model only where both are the same; otherwise it refuses in one line naming the first
difference. A model trained (again) starts from an empty folder: what another run left there (checkpoints, cached
evaluations) is removed first. Cached evaluations are keyed by the checkpoint and data they score
(`evaluation_key`), so they are never read for other weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from attnkit import config as cfgmod
from attnkit.errors import AttnkitError
from attnkit.io import atomic_write_json

IDENTITY = "identity.json"
# what training and scoring leave in a run folder (subwords: BPE-dropout's draws): removed before training anew
RUN_OUTPUTS = ("checkpoints", "eval", "subwords", "finished.json", IDENTITY)


def data_fingerprint(data_dir: str | Path) -> str:
    """sha256 of the prepared folder's files (names and bytes, not its subfolders): another corpus, vocabulary or
    split gives another fingerprint."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(data_dir).iterdir() if p.is_file()):
        digest.update(path.name.encode("utf-8") + b"\0")
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def run_identity(cfg: Any, data_dir: str | Path) -> dict:
    """The record of what a model is trained with: its resolved config and its data (as JSON reads it back)."""
    return json.loads(json.dumps({"config": cfgmod.to_dict(cfg), "data": data_fingerprint(data_dir)}))


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def as_read_now(config: dict) -> dict:
    """A recorded config as this attnkit reads it: a field added since the record was written takes its default,
    which is what the run did before the field existed (the contract under which old checkpoints load too), and
    retired fields go (`config.upgrade`). A record this attnkit cannot read stays as it is, to be compared so."""
    try:
        kind = config["model"]["kind"]
        read = cfgmod.from_dict(cfgmod.family(kind).run, cfgmod.upgrade(config))
        return json.loads(json.dumps(cfgmod.to_dict(read)))  # as `run_identity` records it (tuples as lists)
    except (AttnkitError, KeyError, TypeError, ValueError):
        return config


def difference(recorded: dict, wanted: dict) -> str | None:
    """The first way `recorded` differs from `wanted`, as a user reads it (None: the same)."""
    if recorded.get("data") != wanted["data"]:
        return "other data (the prepared folder's files differ)"
    old, new = _flat(as_read_now(recorded.get("config", {}))), _flat(wanted["config"])
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) != new.get(key):
            return f"{key}={old.get(key)} (this run asks for {new.get(key)})"
    return None


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds anything a training or scoring run left there."""
    return any((run_dir / name).exists() for name in RUN_OUTPUTS)


def mismatch(run_dir: Path, identity: dict) -> str | None:
    """Why the run in `run_dir` is not one of `identity` (None: it is, or there is none)."""
    if not holds_run(run_dir):
        return None
    path = run_dir / IDENTITY
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "settings it has no readable record of (no identity.json)"
    return difference(recorded, identity)


def refuse_other_run(run_dir: Path, identity: dict, hint: str) -> None:
    """One line naming the first difference, where `run_dir` holds a run that is not of `identity`."""
    why = mismatch(run_dir, identity)
    if why is not None:
        raise AttnkitError(f"{run_dir} holds a model trained with {why}: {hint}")


def clear_run(run_dir: Path) -> None:
    """Remove what an earlier run left in `run_dir` (not the folder: its logs are overwritten by the next run)."""
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def record_run(run_dir: Path, identity: dict) -> None:
    """Write the identity beside the model before it trains, so that an interrupted run is known too."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / IDENTITY, identity)


def evaluation_key(checkpoint: Path, data_dir: str | Path) -> str:
    """A short name for (these weights, this data): cached scores of one checkpoint are never read for another."""
    digest = hashlib.sha256()
    with checkpoint.open("rb") as f:
        digest.update(hashlib.file_digest(f, "sha256").digest())
    digest.update(data_fingerprint(data_dir).encode("ascii"))
    return digest.hexdigest()[:16]
