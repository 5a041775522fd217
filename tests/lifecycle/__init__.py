"""Tests of epfleet.lifecycle: gc, retire and costs."""
