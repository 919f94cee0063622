"""The `kiln` command line. Each area adds its subcommands through a `register(subparsers)`
function in its own `cli` module, which the composition root (kiln/cli.py) lists. A command names
its handler by import path (`set_defaults(handler="kiln.area.commands:run")`), imported only when
that command runs: building the parser imports argparse code alone, so `kiln --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

from kiln.platform import console
from kiln.platform.errors import KilnError
from kiln.platform.imports import import_object
from kiln.platform.signals import exit_code
from kiln.platform.suggest import did_you_mean
from kiln.platform.version import __version__

COMMAND_MODULES = [
    "kiln.platform.commands",
    "kiln.platform.reference",
    "kiln.platform.runs_cli",
]


class KilnParser(argparse.ArgumentParser):
    """argparse with "did you mean ...?" for a mistyped command, choice or option."""

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _subparsers(self).get(getattr(namespace, "command", None) or "")
            options = _option_strings(command or self)
            hints = (did_you_mean(x.split("=")[0], options) for x in extras if x.startswith("-"))
            hint = next((h for h in hints if h), "")
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            hint = did_you_mean(value, action.choices)
            choices = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{hint} (choose from {choices})"
            )


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action._name_parser_map.items()
    }


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option of `parser` and of its subcommands (`kiln triton up --port`)."""
    own = [o for action in parser._actions for o in action.option_strings]
    return own + [o for sub in _subparsers(parser).values() for o in _option_strings(sub)]


VERBOSE_HELP = "show Ray's, libraries' and debug output too"


def _verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """`-v` after the command too (`kiln run spec.yaml -v`), in every subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action._name_parser_map.values()):
                if "-v" not in sub._option_string_actions:
                    # SUPPRESS: absent, it leaves the top-level value alone
                    sub.add_argument(
                        "-v",
                        "--verbose",
                        action="store_true",
                        default=argparse.SUPPRESS,
                        help=VERBOSE_HELP,
                    )
                _verbose_everywhere(sub)


def register_command_modules(modules: list[str]) -> None:
    """Add modules whose `register(subparsers)` adds commands (the areas', from kiln/cli.py)."""
    COMMAND_MODULES.extend(m for m in modules if m not in COMMAND_MODULES)


def build_parser() -> argparse.ArgumentParser:
    parser = KilnParser(prog="kiln", description="Raw text to a served language model, on Ray.")
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that area has no CLI yet
                continue
            raise
        module.register(sub)
    _verbose_everywhere(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    console.configure(verbose=args.verbose)  # quiet terminal; the rest in <run>/logs/ (-v: all)
    handler = getattr(args, "handler", None)
    if not handler:
        parser.print_help()
        return 2
    try:
        func = import_object(handler) if isinstance(handler, str) else handler
        return int(func(args) or 0)
    except KilnError as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("kiln: interrupted", file=sys.stderr)
        return exit_code(e)  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them


if __name__ == "__main__":
    sys.exit(main())
