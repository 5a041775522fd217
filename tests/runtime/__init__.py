"""Tests of epfleet.runtime: real ORT compiles, shapes, worker processes' output."""
