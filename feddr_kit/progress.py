"""Progress of the kit's long loops (rounds, sweep runs, fine-tuned clients, decoded images), shown the
way the place it runs in can show it.

Three kinds: ``widgets`` (tqdm's notebook bar, in a notebook someone is looking at), ``bars`` (tqdm's
terminal bar, when stderr is a terminal) and ``lines`` (plain-text lines on stderr, at most one every
:data:`INTERVAL` seconds plus the first and the last). Lines are for everything else: a log file, CI,
and notebooks executed in batch (papermill, nbconvert, nbval), where a widget never renders: the saved
notebook shows "0% 0/10" and the terminal nothing. ``papermill --log-output`` copies the lines to the
terminal as they come. :func:`kind` picks one; ``FEDDR_PROGRESS=lines|bars|widgets`` overrides it.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterator

KINDS = ("lines", "bars", "widgets")
INTERVAL = 10.0  # seconds between two progress lines: a few per minute of a run, never a flood
# Programs that execute notebooks without a live frontend, as they appear in the kernel's parent command line.
BATCH_EXECUTORS = ("papermill", "nbconvert", "nbclient", "pytest", "nbval")
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, {remaining} left{postfix}"


def _in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel attached)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _parent_command() -> str:
    """The command line of this process's parent (Linux; empty where it cannot be read)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def batch_kernel() -> bool:
    """Whether this process is a Jupyter kernel started by a batch executor (:data:`BATCH_EXECUTORS`:
    papermill, nbconvert, nbclient, nbval under pytest), where no front end will ever render a widget."""
    return _in_kernel() and any(name in _parent_command().lower() for name in BATCH_EXECUTORS)


def kind() -> str:
    """How progress is shown here: ``FEDDR_PROGRESS`` when set to one of :data:`KINDS`; else in a kernel
    started by a batch executor (:data:`BATCH_EXECUTORS`) ``lines``, in another kernel ``widgets``; outside
    a kernel ``bars`` when stderr is a terminal, else ``lines``."""
    wanted = os.environ.get("FEDDR_PROGRESS", "").strip().lower()
    if wanted in KINDS:
        return wanted
    if _in_kernel():
        return "lines" if batch_kernel() else "widgets"
    isatty = getattr(sys.stderr, "isatty", None)
    return "bars" if isatty is not None and isatty() else "lines"


class Lines:
    """A progress display that prints plain lines to stderr (the tqdm calls the kit uses: ``update``,
    ``set_postfix``, ``close``, a context manager): one when it starts, then at most one every
    ``interval`` seconds, and one at the end, each a full sentence that reads well in a log."""

    def __init__(self, total: int | None, desc: str = "", unit: str = "it", initial: int = 0,
                 interval: float = INTERVAL, file: Any = None):
        self.total, self.desc, self.unit, self.n, self.interval = total, desc, unit, initial, interval
        self.file, self.postfix, self.closed, self._first = file, "", False, initial
        self._start = time.monotonic()
        self._last_time, self._last_n = self._start, None
        self._emit()

    def _emit(self) -> None:
        from tqdm import tqdm

        # initial: the rate counts this session's items only, so a resumed run's time left is not from round 0
        line = tqdm.format_meter(self.n, self.total, time.monotonic() - self._start, prefix=self.desc, unit=self.unit,
                                 initial=self._first, postfix=self.postfix or None,
                                 bar_format=LINE_FORMAT if self.total else "{desc}: {n_fmt} {unit}, {elapsed} elapsed{postfix}")
        print(line, file=self.file or sys.stderr, flush=True)
        self._last_time, self._last_n = time.monotonic(), self.n

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items; print a line when :attr:`interval` seconds passed since the last one."""
        self.n += n
        if time.monotonic() - self._last_time >= self.interval:
            self._emit()

    def set_postfix(self, **values: Any) -> None:
        """Values shown after the count on the next line (``acc=0.41``)."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        """Print the last line (unless the count has not moved since the one before)."""
        if not self.closed and self._last_n != self.n:
            self._emit()
        self.closed = True

    def __enter__(self) -> "Lines":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Off:
    """The display of ``progress=False``: counts nothing, shows nothing."""

    def update(self, n: int = 1) -> None:
        """Nothing."""

    def set_postfix(self, **values: Any) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""

    def __enter__(self) -> "_Off":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def bar(total: int | None, desc: str = "", *, unit: str = "it", initial: int = 0, disable: bool = False,
        leave: bool = True) -> Any:
    """A progress display of :func:`kind` for a loop of ``total`` items (``initial`` already done):
    :class:`Lines`, or a tqdm bar (terminal or notebook). ``disable``: show nothing. Returns an object
    with tqdm's ``update``, ``set_postfix`` and ``close``, usable as a context manager."""
    if disable:
        return _Off()
    shown = kind()
    if shown == "lines":
        return Lines(total, desc, unit=unit, initial=initial)
    if shown == "widgets":
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave, dynamic_ncols=True)


def each(items: Any, desc: str = "", *, unit: str = "it", disable: bool = False) -> Iterator[Any]:
    """The items of a sized iterable, one by one, with a progress display (:func:`bar`) counting them."""
    with bar(len(items), desc, unit=unit, disable=disable) as shown:
        for item in items:
            yield item
            shown.update(1)


def write(text: str) -> None:
    """Print a line of a loop's own (a finished run of a sweep) without breaking a bar that is shown."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr if kind() == "lines" else None)
