"""Run `attnkit` under torchrun and record the paths this rank writes (used by tests/test_distributed.py).

    torchrun --nproc_per_node 2 tests/ddp_audit.py AUDIT_DIR train --data ... --out ...

Each rank writes AUDIT_DIR/rank<N>.txt: every path it opened for writing, created, renamed or removed,
as seen by Python's audit hooks (sys.addaudithook), which also see the libraries' writes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
CHANGES = {"os.rename": (0, 1), "os.replace": (0, 1), "os.mkdir": (0,), "os.remove": (0,), "os.rmdir": (0,),
           "os.link": (0, 1), "os.symlink": (1,), "shutil.copyfile": (1,)}


def main() -> int:
    audit_dir, argv = Path(sys.argv[1]), sys.argv[2:]
    written: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, str | bytes | os.PathLike) and (
                    any(c in (mode or "") for c in "wax+") or (flags or 0) & WRITE_FLAGS):
                written.append(os.fsdecode(path))
        elif event in CHANGES:
            written.extend(os.fsdecode(args[i]) for i in CHANGES[event] if isinstance(args[i], str | bytes))

    sys.addaudithook(hook)
    from attnkit.cli.main import main as attnkit_main

    code = attnkit_main(argv)
    report = "\n".join(os.path.abspath(p) for p in written)
    (audit_dir / f"rank{os.environ.get('RANK', '0')}.txt").write_text(report)
    return code


if __name__ == "__main__":
    sys.exit(main())
