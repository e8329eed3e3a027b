"""`edgepress search` (issue 25), a client of the ordinary pipeline: its pieces land one at a time."""

from edgepress.callable_package import make_callable

make_callable(__name__)  # edgepress.search(...) is the Python API's function
