"""Helpers the tests share (not tests): fault-injecting proxies and mirrors, signed and
compiled stores, spec writers. Imported one way: ``from tests.support.<module> import ...``."""
