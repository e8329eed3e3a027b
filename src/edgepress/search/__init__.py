"""`edgepress search` (issue 25), a client of the ordinary pipeline: its pieces land one at a time."""
