"""The ``epfleet`` command line, the top layer: the app, its entry point and exit codes
(``app``), one module per command (``compile``, ``sync``, ``manifest``, ``trust``,
``store`` for gc and retire, ``serve`` for watch and serve), the options they share
(``options``), Ctrl-C (``interrupts``) and Prefect's temporary API (``prefect_api``). Only
this package imports ``flows`` and ``deployments``, and nothing in epfleet imports it."""
