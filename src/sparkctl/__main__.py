"""`python -m sparkctl` runs the CLI."""

import sys

from sparkctl.cli.app import main

sys.exit(main())
