"""`python -m canarchy` runs the command-line interface."""

import sys

from canarchy.cli import main

sys.exit(main())
