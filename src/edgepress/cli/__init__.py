"""The typer command-line app (`edgepress`)."""
