"""`python -m spawner.cli`: the same as the installed `gpu-pool` command."""

import sys

from .main import main

sys.exit(main())
