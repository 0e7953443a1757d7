"""``python -m gateway`` is the ``cmq-gateway`` command."""

import sys

from gateway.cli import main

sys.exit(main())
