import sys

from kiln.training.plan.commands import main

sys.exit(main())
