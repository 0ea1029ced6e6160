"""Presets and YAML config files: where they are, what they say, how they layer and take overrides.

A preset is `attnkit/configs/NAME.yaml` (or any YAML file); it may build on another with `base: NAME`.
Overrides look like `model.d_model=256`; their values are read as YAML scalars. attnkit.config turns the
merged dict into validated dataclasses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnkit.errors import ConfigError, did_you_mean

PRESET_DIR = Path(__file__).parent / "configs"


def preset_names() -> list[str]:
    """The presets shipped with attnkit (src/attnkit/configs/*.yaml), by name."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_summary(name: str) -> str:
    """A preset's description: the comment lines that open its file, joined."""
    lines = []
    for line in preset_path(name).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


def preset_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"no such config file: {str(path)!r}")
        return path
    candidate = PRESET_DIR / f"{name_or_path}.yaml"
    if not candidate.exists():
        raise ConfigError(f"unknown preset {name_or_path!r}{did_you_mean(name_or_path, preset_names())}")
    return candidate


def load_yaml(path: Path, _seen: tuple[Path, ...] = ()) -> dict:
    data = _parse_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    # A preset may build on another: `base: transformer-small`.
    base = data.pop("base", None)
    if not base:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base: expected a preset name or file, got {base!r}")
    base_path = preset_path(base)
    if base_path.resolve() in _seen + (path.resolve(),):
        raise ConfigError(f"{path}: base: {base!r} builds on itself")
    return deep_merge(load_yaml(base_path, _seen + (path.resolve(),)), data)


def _parse_yaml(path: Path) -> Any:
    """The YAML document in `path`; every way it can be unreadable becomes a one-line ConfigError."""
    import yaml  # here: listing the presets (every verb's --help) needs no YAML parser

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML ({e.problem or e.context or 'syntax error'})") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, most control characters)
        char = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise ConfigError(f"{path}: invalid YAML ({e.reason}: {char} at character {e.position})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML (nested too deeply)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config {path}: {e}") from None


def deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`model.d_model=256` -> (['model', 'd_model'], 256); values are parsed as YAML scalars."""
    import yaml

    text = text.removeprefix("--")
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = dict(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for depth, k in enumerate(keys[:-1], start=1):
            if not isinstance(node.get(k) or {}, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(keys[:depth])} is a value, not a section")
            node[k] = dict(node.get(k) or {})
            node = node[k]
        node[keys[-1]] = value
    return data
