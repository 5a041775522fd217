"""Tests of the project as a whole: docs, layout, import graph, test tiers, settings, real
third-party models, a busy machine."""
