"""Ctrl-C that is not lost. Python drops an exception raised inside a finalizer or a weakref callback (it prints
"Exception ignored in ..." and goes on), so a KeyboardInterrupt that lands while the garbage collector runs one would
let a run or a search go on as if no one had asked it to stop. Within `latched()`, SIGINT is also recorded,
`check()` raises it again at the loops' safe points (each training step, stage attempt and search trial), and the
dropped one is not printed as a traceback (it is not lost, so there is nothing to report)."""

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_seen = threading.Event()


def _handler(signum: int, frame) -> None:
    _seen.set()
    signal.default_int_handler(signum, frame)


@contextlib.contextmanager
def latched() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt as always and is remembered until the block ends (main thread only: no
    other can set a signal handler)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is _handler:
        yield
        return
    previous, previous_hook = signal.signal(signal.SIGINT, _handler), sys.unraisablehook

    def unraisable(unraisable) -> None:
        if not (_seen.is_set() and issubclass(unraisable.exc_type, KeyboardInterrupt)):
            previous_hook(unraisable)

    _seen.clear()
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook
        _seen.clear()


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed within `latched()`, even if the one it raised was lost."""
    if _seen.is_set():
        raise KeyboardInterrupt
