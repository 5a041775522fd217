"""Tests of the ``eps`` package: the EP registry and modules, discovery on this host."""
