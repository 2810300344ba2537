import sys

from ccbench.cli import main
from ccbench.run.torchrun_errors import install

install()                   # under torchrun, its report names ccbench's error line
sys.exit(main())
