import sys

from kiln.platform.cli import main

if __name__ == "__main__":
    sys.exit(main())
