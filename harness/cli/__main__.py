"""`python -m harness.cli`: the dtbench command, without the console script."""

import sys

from harness.cli import main

sys.exit(main())
