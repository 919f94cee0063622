import sys

from kiln.cli import main

if __name__ == "__main__":
    sys.exit(main())
