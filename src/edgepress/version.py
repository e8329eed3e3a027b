"""edgepress's version (pyproject.toml's), in a module of its own: what the reports, bundles and stage cache record
imports this, not the package root, which sits above every package (it offers the Python API)."""

__version__ = "0.1.0"
