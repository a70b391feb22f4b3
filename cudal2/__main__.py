import sys

from cudal2.cli import main

sys.exit(main())
