"""Models: loading HF classifier dirs, the one training loop, the demo teacher, introspection."""
