from ccbench.cli import main
from ccbench.run.exit import leave
from ccbench.run.torchrun_errors import install

install()                   # under torchrun, its report names ccbench's error line
status: str | int | None
try:
    status = main()
except SystemExit as end:
    status = end.code
leave(status)
