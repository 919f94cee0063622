"""The `kiln` command line. Each area adds its subcommands through a `register(subparsers)`
function in its own `cli` module, which the composition root (kiln/cli.py) lists; handlers
import heavy libraries only when they run."""

from __future__ import annotations

import argparse
import importlib
import sys

from kiln.platform.errors import KilnError

COMMAND_MODULES = [
    "kiln.platform.commands",
    "kiln.platform.reference",
    "kiln.platform.runs",
]


def register_command_modules(modules: list[str]) -> None:
    """Add modules whose `register(subparsers)` adds commands (the areas', from kiln/cli.py)."""
    COMMAND_MODULES.extend(m for m in modules if m not in COMMAND_MODULES)


def build_parser() -> argparse.ArgumentParser:
    from kiln.platform.version import __version__

    parser = argparse.ArgumentParser(
        prog="kiln", description="Raw text to a served language model, on Ray."
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show Ray's, libraries' and debug output too"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that area has no CLI yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from kiln.platform import console

    console.configure(verbose=args.verbose)  # quiet terminal; the rest in <run>/logs/ (-v: all)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KilnError as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
