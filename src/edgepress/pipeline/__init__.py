"""The pipeline: stages, gates, the run directory and the report."""
