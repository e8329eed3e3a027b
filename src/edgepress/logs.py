"""What a person reads in the log: edgepress's own lines in plain words and rounded numbers, and what the libraries
under it log (ONNX Runtime's quantizer and transformer fusions, its model converter) collected and said once each,
with a count, instead of once per call."""

import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("edgepress")


def readable(value) -> str:
    """A value for a log line: floats to 4 significant digits, a dict as 'key value, key value', a list in brackets."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {readable(v)}" if not isinstance(v, dict) else f"{k} ({readable(v)})"
                         for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):
        return f"[{', '.join(map(readable, value))}]" if value else "none"
    return str(value)


def words(name: str) -> str:
    """A metric's or a field's name as words: `neighbour_overlap` -> "neighbour overlap"."""
    return name.replace("_", " ")


def duration(seconds: float) -> str:
    """'0.4 s', '12 s', '3 min 05 s', '1 h 02 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


@contextmanager
def step(what: str, logger: logging.Logger = log) -> Iterator[None]:
    """A long step said as it starts and, with its duration, as it ends: a line each in the log, so that a run
    without a terminal (CI, a log file) shows what it is doing. An error ends it unsaid: the error says the rest."""
    logger.info("%s ...", what)
    started = time.perf_counter()
    yield
    logger.info("%s: done in %s", what, duration(time.perf_counter() - started))


def tracked(items: Iterable, total: int, what: str) -> Iterator:
    """`items` one by one, with a progress bar (what, how many, time left) on a terminal, drawn on stderr, or in a
    notebook's cell, and cleared at the end; nothing elsewhere (a log file would keep every redraw)."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    if not (console.is_terminal or console.is_jupyter):
        yield from items
        return
    with Progress(*Progress.get_default_columns(), console=console, transient=True) as progress:
        task = progress.add_task(what, total=total)
        for item in items:
            yield item
            progress.advance(task)


class Pace:
    """A progress line for long work over many texts, at most one every `EVERY` seconds: '<what>: 40,960 of 620,000
    texts, 1,234 texts/s, 7 min 48 s left' (a log line, so that a run without a terminal shows it too)."""

    EVERY = 30.0  # seconds between two lines

    def __init__(self, what: str, total: int, logger: logging.Logger = log) -> None:
        self.what, self.total, self.logger = what, total, logger
        self.started = self.said = time.perf_counter()

    def rate(self, done: int) -> float:
        """Texts a second so far."""
        return done / max(time.perf_counter() - self.started, 1e-9)

    def advance(self, done: int) -> None:
        """Say where the work stands (`done` of `total`) if `EVERY` seconds have passed since it last did."""
        now = time.perf_counter()
        if now - self.said >= self.EVERY and 0 < done < self.total:
            self.said, rate = now, self.rate(done)
            self.logger.info("%s: %s of %s texts, %s texts/s, %s left", self.what, f"{done:,}", f"{self.total:,}",
                             f"{rate:,.0f}", duration((self.total - done) / rate))


def parity_text(parity: dict) -> str:
    """'max |Δlogit| 9.3e-09, label agreement 1 on 60 texts' from a parity record (a sentence embedder's: max
    |Δcomponent| and its lowest cosine to the reference vectors)."""
    if "min_cosine" in parity:
        return (f"max |Δcomponent| {parity['max_abs_diff']:.2g}, lowest cosine {parity['min_cosine']:.6f} on "
                f"{parity['n_examples']} texts")
    return (f"max |Δlogit| {parity['max_abs_diff']:.2g}, label agreement {parity['agreement']:.4g} on "
            f"{parity['n_examples']} {parity.get('examples', 'texts')}")


class LibraryMessages(logging.Handler):
    """On the root logger: counts the records of every logger but edgepress's own, printing none of them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: Counter = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("edgepress"):
            self.seen[(record.levelno, _source(record), _message(record))] += 1


def _message(record: logging.LogRecord) -> str:
    """The message; a Python warning's without the file, line and source line `warnings` puts around it."""
    message = record.getMessage().strip()
    warning = re.search(r"^\S+:\d+: (\w+: .*)$", message.splitlines()[0]) if record.name == "py.warnings" else None
    return warning.group(1) if warning else message


def _source(record: logging.LogRecord) -> str:
    """The logger's name; for the root logger (a module-level `logging.warning`), the package that called it."""
    if record.name == "py.warnings":  # the file that warned: "/.../site-packages/transformers/x.py:12: ..."
        found = re.search(r"site-packages/([^/]+)/", record.getMessage())
        return found.group(1) if found else "python"
    if record.name != "root":
        return record.name
    path = Path(record.pathname).parts
    return path[path.index("site-packages") + 1] if "site-packages" in path[:-1] else record.module


LIBRARY_MESSAGES = LibraryMessages()


def collect_library_messages() -> None:
    """Route every library's log records and Python warnings to `LIBRARY_MESSAGES` (the CLI does this once). With a
    handler on the root logger, a library's module-level `logging.warning` no longer installs Python's default one
    either."""
    root = logging.getLogger()
    if LIBRARY_MESSAGES not in root.handlers:
        root.addHandler(LIBRARY_MESSAGES)
    logging.captureWarnings(True)  # Python warnings (torch's, numpy's) too, through the py.warnings logger


def summarise_library_messages(where: str) -> None:
    """Log each distinct library message collected since the last summary once, at its own level, with a count."""
    for (level, name, message), n in sorted(LIBRARY_MESSAGES.seen.items()):
        log.log(level, "%s: %s said%s: %s", where, name,
                f" {n} times" if n > 1 else "", message)
    LIBRARY_MESSAGES.seen.clear()


@contextmanager
def quiet(logger_name: str):
    """Inside, `logger_name` logs warnings only (e.g. a method called many times over to time candidates)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def collected(logger_name: str):
    """Inside, a library logger that prints through its own handler (neural-compressor's: a line per layer and
    step) sends its warnings to the root logger, where they are collected, and drops its progress lines."""
    logger = logging.getLogger(logger_name)
    saved = logger.handlers[:], logger.propagate, logger.level
    logger.handlers, logger.propagate = [], True
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])


# transformers imports torchao (neural-compressor's dependency) on every model load; its import logs CUDA-only kernels
# it could not load, and torch a deprecation of torchao's pytree registration: neither concerns a run
NOISY = ("torchao", "torch.utils._pytree")


@contextmanager
def library_call(transformers: bool = True) -> Iterator[None]:
    """A call of the Python API: inside, the libraries under edgepress print nothing of their own (their log
    records and Python warnings collected as the CLI collects them, said once each in edgepress's log; with
    `transformers`, its per-load tables and progress bars off) and edgepress prints nothing but through the
    handlers its caller configured; on leaving, every setting changed is as it was."""
    import warnings

    root, levels = logging.getLogger(), {name: logging.getLogger(name).level for name in NOISY}
    added = LIBRARY_MESSAGES not in root.handlers
    capturing = getattr(logging, "_warnings_showwarning", None) is not None
    hub = hf = None
    if transformers:
        import huggingface_hub.utils as hub
        import transformers.utils.logging as hf

        said = hf.get_verbosity(), hf.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
        hf.set_verbosity_error()
        hf.disable_progress_bar()
        hub.disable_progress_bars()
    for name in NOISY:
        logging.getLogger(name).setLevel(logging.ERROR)
    if added:
        root.addHandler(LIBRARY_MESSAGES)  # and so no library's module-level logging.warning installs a stderr one
    try:
        with warnings.catch_warnings():
            logging.captureWarnings(True)
            yield
    finally:
        if not capturing:
            logging.captureWarnings(False)
        if added:
            root.removeHandler(LIBRARY_MESSAGES)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if hf is not None:
            hf.set_verbosity(said[0])
            (hf.enable_progress_bar if said[1] else hf.disable_progress_bar)()
            if not said[2]:
                hub.enable_progress_bars()


def log_to(console) -> None:
    """A command's logging: edgepress's progress (INFO) to the rich `console`; the libraries' noise quieted (set
    TRANSFORMERS_VERBOSITY or HF_HUB_DISABLE_PROGRESS_BARS to see it again); ONNX Runtime's warnings collected, said
    once each at the end of a step (`summarise_library_messages`), not once per call."""
    import os

    from rich.logging import RichHandler

    # transformers 5 logs a table per model load and draws progress bars for loading and saving weights; edgepress
    # reports what matters itself (a missing head is a ModelError)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    collect_library_messages()
    package = logging.getLogger("edgepress")
    package.addHandler(RichHandler(console=console, show_path=False, show_level=False))
    package.setLevel(logging.INFO)  # progress of long steps (teacher epochs, stages)
    package.propagate = False  # libraries that configure the root logger would repeat it
