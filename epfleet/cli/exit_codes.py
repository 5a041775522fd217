"""The exit codes of every ``epfleet`` command, defined once."""

from __future__ import annotations

import signal

EXIT_OK = 0
"""Everything asked was done (or was up to date)."""
EXIT_FAILED = 1
"""A pair, a model or the store failed; everything else was still done."""
EXIT_BAD_INPUT = 2
"""Bad input (the reason names the option or field): nothing was done."""
EXIT_INTERRUPTED = 128 + signal.SIGINT
"""130, as a shell reports a Ctrl-C."""
