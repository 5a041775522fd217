"""Tests of epfleet.formats: the manifest model and the fleet spec."""
