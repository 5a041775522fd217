"""Tests of epfleet.fleet: planning, dispatch, verification, publishing, watch and rollout
rules, quantised and multi-file builds."""
