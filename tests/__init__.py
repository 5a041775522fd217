"""The test suite, one directory per area of the package (``tests/<area>/``); shared helpers
in ``tests/support`` (imported as ``tests.support.<module>``), shared fixtures in
``conftest.py`` files."""
