"""Device reports as evidence: read from the store, attributed to enrolled devices,
indexed, and counted per published variant."""
