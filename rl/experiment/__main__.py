"""`python -m cudal2_rl.experiment ...` (cli.py)."""
import sys

from cudal2_rl.experiment.cli import main

sys.exit(main())
