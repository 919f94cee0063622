import sys

from kiln.training.plan.cli import main

sys.exit(main())
