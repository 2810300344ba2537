import sys

from ccbench.cli import main

sys.exit(main())
