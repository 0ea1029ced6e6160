"""`attnkit presets [NAME]`: the shipped config presets, and every field of one (what overrides can set)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable


def add_parsers(sub) -> dict[str, Callable]:
    p = sub.add_parser("presets", help="list the config presets, or print every field of one")
    p.add_argument("name", nargs="?", metavar="NAME", help="a preset (or YAML file) to print in full, as resolved")
    return {"presets": cmd_presets}


def cmd_presets(args, overrides: list[str]) -> None:
    import yaml

    from attnkit import config as cfgmod
    from attnkit.presets import preset_names, preset_summary

    if args.name is None:
        names = preset_names()
        width = max(map(len, names))
        for name in names:
            print(textwrap.fill(f"{name:<{width}}  {preset_summary(name)}", width=100,
                                subsequent_indent=" " * (width + 2)))
        print("\n`attnkit presets NAME` prints every field of one; use it with --config NAME, and change a field "
              "with --model.FIELD=VALUE or --train.FIELD=VALUE.")
        return
    print(yaml.safe_dump(cfgmod.to_dict(cfgmod.resolve([args.name])), sort_keys=False), end="")
