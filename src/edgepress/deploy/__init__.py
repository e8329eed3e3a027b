"""The device side of a run: the bundle a device runs without torch. Never imports torch or transformers."""
