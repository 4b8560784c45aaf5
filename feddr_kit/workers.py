"""Tasks side by side: ``fn(item, emit, context)`` for every item, ``jobs`` at a time, each job a process of
its own (:func:`run_each`), with the events a task emits shown by the parent as they happen.

The processes are ``spawn``-ed (``concurrent.futures.ProcessPoolExecutor``): a fresh interpreter starts
CUDA and torch's thread pool cleanly, where a forked copy of a process that already used them may
hang. Each sets its torch threads (``threads``) and builds its ``context`` once (``setup``), so a task
that loads data loads it once per process, not once per task.

Ctrl-C stops every task and keeps nothing running. A process starts with SIGINT ignored and a task
takes it only while it runs, so the interrupt reaches the code that releases what the task holds (a run
folder's lock) instead of killing a process between tasks. On an interrupt the parent stops handing out
tasks, sends SIGINT to every process (in a notebook only the kernel gets the interrupt; in a terminal
the processes got it already and ignore the second one), waits for them to unwind and raises
``KeyboardInterrupt``. A task whose parent has died stops at its next event.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

import torch

from .errors import FeddrKitError

# Seconds between two looks at the events while the tasks run: progress shows within this delay.
POLL_S = 0.1

Emit = Callable[[tuple], None]


class _Child:
    """What a task process holds: its parent, the event queue, the stop flag, its context."""
    parent: int = 0
    events: Any = None
    stop: Any = None
    context: Any = None


def run_each(fn: Callable[[Any, Emit, Any], Any], items: Sequence[Any], jobs: int, *, threads: int | None = None,
             setup: Callable[..., Any] | None = None, setup_args: tuple = (),
             on_event: Callable[[int, tuple], None] = lambda index, event: None,
             on_result: Callable[[int, Any], None] = lambda index, result: None) -> None:
    """Call ``fn(item, emit, context)`` for every item of ``items``, ``jobs`` at a time.

    ``context`` is ``setup(*setup_args)`` (None without ``setup``), built once per process. ``emit(event)``
    (a picklable tuple) calls ``on_event(index, event)`` in this process as the task goes; each task's
    return value goes to ``on_result(index, value)`` as it ends. A warning a task raises is raised again
    here. ``jobs=1``: in this process, in order (``fn``, ``items`` and ``setup_args`` may be anything).
    ``jobs > 1``: ``min(jobs, len(items))`` spawned processes, results in the order they end; ``fn``, the
    items, ``setup`` and ``setup_args`` must pickle (module-level functions). ``threads``: torch's intra-op
    threads in each task's process (None: torch's default there; with ``jobs=1`` this process's, set for
    the tasks and put back after). An exception of a task (``KeyboardInterrupt`` included) stops the
    others and is raised here; a process that dies (killed, out of memory) raises :class:`FeddrKitError`.
    """
    check_jobs(jobs, threads)
    if not items:
        return
    if jobs == 1:
        _in_this_process(fn, items, threads, setup, setup_args, on_event, on_result)
    else:
        _in_processes(fn, items, min(jobs, len(items)), threads, setup, setup_args, on_event, on_result)


def check_jobs(jobs: Any, threads: Any = None) -> None:
    """One-line :class:`FeddrKitError` unless ``jobs`` is an integer >= 1 and ``threads`` None or one."""
    for name, value in (("jobs", jobs), ("threads", threads)):
        if (value is not None or name == "jobs") and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise FeddrKitError(f"{name} must be an integer >= 1, got {value!r}")


def _in_this_process(fn, items, threads, setup, setup_args, on_event, on_result) -> None:
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        context = setup(*setup_args) if setup is not None else None
        for index, item in enumerate(items):
            on_result(index, fn(item, lambda event, index=index: on_event(index, event), context))
    finally:
        torch.set_num_threads(previous)


def _in_processes(fn, items, jobs, threads, setup, setup_args, on_event, on_result) -> None:
    spawn = multiprocessing.get_context("spawn")
    events, stop = spawn.Queue(), spawn.Event()
    pids: set[int] = set()
    futures: dict = {}
    pool = ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_start,
                               initargs=(os.getpid(), threads, events, stop, setup, setup_args))
    try:
        with _sigint_ignored():  # the processes start on submit, and keep SIGINT ignored until a task runs
            futures = {pool.submit(_call, fn, index, item): index for index, item in enumerate(items)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            _deliver(events, pids, on_event)
            for future in done:
                result = future.result()  # a task's exception, raised here
                if result is not _NOT_STARTED:
                    on_result(futures[future], result)
        _deliver(events, pids, on_event)
    except BrokenProcessPool:
        _stop_all(pool, futures, stop, events, pids)
        raise FeddrKitError("a task's process ended abruptly (killed, or out of memory); what it held is left as a "
                            "killed run leaves it: run the same again to go on") from None
    except BaseException:
        _stop_all(pool, futures, stop, events, pids)
        raise
    pool.shutdown(wait=True)


def _stop_all(pool: ProcessPoolExecutor, futures, stop, events, pids: set[int]) -> None:
    """Stop every task: none starts any more, the running ones get SIGINT; wait for them to end, reading
    their last events meanwhile (a process ends only once what it sent is read), then for the processes.
    A second Ctrl-C while waiting kills them."""
    stop.set()
    for future in futures:
        future.cancel()
    _deliver(events, pids, None)
    for pid in pids:
        _signal(pid, signal.SIGINT)
    try:
        pending = {f for f in futures if not f.done()}
        while pending:
            _, pending = wait(pending, timeout=POLL_S)
            _deliver(events, pids, None)
        pool.shutdown(wait=True)
    except KeyboardInterrupt:
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        raise


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _deliver(events, pids: set[int], on_event) -> None:
    """Hand every event that has arrived to ``on_event`` (a process's pid is kept in ``pids``; a warning is
    raised again here)."""
    while True:
        try:
            index, event = events.get_nowait()
        except queue.Empty:
            return
        if event[0] == "pid":
            pids.add(event[1])
        elif event[0] == "warning":
            warnings.warn(event[1], event[2], stacklevel=2)
        elif on_event is not None:
            on_event(index, event)


class _sigint_ignored:
    """SIGINT ignored in the block (in the main thread, the only one that may set handlers), so processes
    started in it inherit it ignored."""

    def __enter__(self) -> None:
        self.previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------- in a task's process
_NOT_STARTED = "__not started: the tasks were stopped__"


def _start(parent: int, threads: int | None, events, stop, setup, setup_args) -> None:
    """A task process's start: SIGINT ignored between tasks, its torch threads, its context."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Child.parent, _Child.events, _Child.stop = parent, events, stop
    events.put((None, ("pid", os.getpid())))
    if threads is not None:
        torch.set_num_threads(threads)
    _Child.context = setup(*setup_args) if setup is not None else None


def _interrupted(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one interrupt: what the task holds is released undisturbed
    raise KeyboardInterrupt


def _call(fn, index: int, item: Any) -> Any:
    """Run one task in a task process: interruptible while it runs, its warnings and events sent to the parent."""
    signal.signal(signal.SIGINT, _interrupted)  # set before the stop flag is read: a stop sent after is seen
    try:
        if _Child.stop.is_set():
            return _NOT_STARTED

        def emit(event: tuple) -> None:
            if os.getppid() != _Child.parent:  # the parent died: nobody will show this run, so it stops here
                raise KeyboardInterrupt
            _Child.events.put((index, event))

        with warnings.catch_warnings():
            warnings.showwarning = lambda message, category, *args, **kwargs: emit(("warning", str(message), category))
            return fn(item, emit, _Child.context)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
