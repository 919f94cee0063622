"""The `kiln` command line of the composition root: every area's commands (each area's `cli`
module has a `register(subparsers)`, which adds its sub-packages' commands too), on the
platform's parser. Imported with the `kiln` package, so `kiln.platform.cli:main` (the console
script) sees them."""

from __future__ import annotations

import sys

from kiln.platform.cli import main, register_command_modules

AREA_COMMANDS = ["kiln.curator.cli", "kiln.training.cli", "kiln.serving.cli", "kiln.evaluate.cli"]

register_command_modules(AREA_COMMANDS)

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
