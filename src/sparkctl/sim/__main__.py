"""`python -m sparkctl.sim serve ...`: the simulated engine (the image's `vllm`)."""

import sys

from sparkctl.sim.main import main

sys.exit(main())
