"""``python -m deltasync ARGS...``: the deltasync CLI shipped inside the package.

Runs ``deltasync/bin/deltasync`` (the same binary as ``build/deltasync``)
with the same arguments, output and exit status (0 ok, 1 error, 2 usage).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def cli_path() -> str:
    """Path of the CLI binary installed with the package."""
    return str(Path(__file__).resolve().parent / "bin" / "deltasync")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    path = cli_path()
    if not os.access(path, os.X_OK):
        print(f"deltasync: error: the CLI binary {path} is missing; reinstall the package", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Replace this process: signals, exit status and stdio are the binary's own.
    os.execv(path, ["deltasync", *args])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
