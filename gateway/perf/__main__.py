"""`python -m gateway.perf`: the same as `cmq-gateway perf`."""

import sys

from gateway.perf.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
