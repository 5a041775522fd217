"""``python -m epfleet``: the same as the ``epfleet`` command."""

import sys

from epfleet.cli.app import main

sys.exit(main())
