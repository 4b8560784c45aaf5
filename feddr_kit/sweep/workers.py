"""Tasks side by side: ``fn(item, emit, context)`` for every item, ``jobs`` at a time, each job a process of
its own (:func:`run_each`), with the events a task emits shown by the parent as they happen.

The processes are ``spawn``-ed: a fresh interpreter starts CUDA and torch's thread pool cleanly, where a
forked copy of a process that already used them may hang. Each sets its torch threads (``threads``) and
builds its ``context`` once (``setup``), so a task that loads data loads it once per process, not once per
task.

The pool is written here over ``multiprocessing.Process`` with two one-way pipes per process, rather than
taken from ``concurrent.futures``, so that every wait has a bound. A pipe has no feeder thread to flush at
exit (a ``multiprocessing.Queue`` has one, and a process whose queue nobody reads any more never exits); a
message under ``PIPE_BUF`` bytes, as every event is, goes through whole or not at all, so an interrupt
never leaves half of one; and the parent watches each process's sentinel, so it tells a task that raised
from a process that died.

Stopping. Ctrl-C stops every task and keeps nothing running. A process starts with SIGINT ignored and a
task takes SIGINT and SIGTERM only while it runs, so the interrupt reaches the code that releases what the
task holds (a run folder's lock) instead of killing a process between tasks. On an interrupt, a task's
exception or a lost process, the parent hands out no more tasks, tells every process to stop, sends SIGINT
to those running a task (in a notebook only the kernel gets the interrupt; in a terminal the processes got
it already and ignore the second one) and waits for them to unwind, at most :data:`UNWIND_S`, reading their
last messages; then it tells them to exit, waits :data:`EXIT_S` and kills what is left. A second Ctrl-C
meanwhile kills them at once. A process whose parent dies (kill -9) interrupts its own task, which releases
what it holds, and exits within :data:`ORPHAN_GRACE_S` whatever the task does.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from multiprocessing import connection
from typing import Any, Callable, Sequence

import torch

from ..errors import FeddrKitError

# Seconds between two looks at the processes while the tasks run: progress shows within this delay.
POLL_S = 0.1
# Seconds the interrupted tasks get to unwind (release what they hold) once the tasks are stopped.
UNWIND_S = 30.0
# Seconds the processes get to exit once told to, then again once killed.
EXIT_S = 10.0
# How often a task process looks whether its parent is still alive, and how long it then gives its task
# to unwind before it exits regardless.
WATCH_S = 0.5
ORPHAN_GRACE_S = 10.0
# The exit status of a process that found the main script calling run_each at its module level.
IMPORTING_MAIN_EXIT = 86

Emit = Callable[[tuple], None]

# Messages from the parent to a task process (besides a task, ``(index, item)``).
_STOP, _EXIT = "stop", "exit"


class WorkerLostError(FeddrKitError):
    """A task's process ended abruptly (killed, out of memory). The message is one line: which, how, and
    that running the same again goes on."""

    exit_code = 1  # the input was valid and a run failed


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
    items, ``setup`` and ``setup_args`` must pickle (module-level functions), and a script that calls this
    must do so under ``if __name__ == "__main__":``. ``threads``: torch's intra-op threads in each task's
    process (None: torch's default there; with ``jobs=1`` this process's, set for the tasks and put back
    after). An exception of a task (``KeyboardInterrupt`` included) stops the others and is raised here; a
    process that dies (killed, out of memory) raises :class:`WorkerLostError`. Every wait is bounded: when
    this returns or raises, no process it started is left.
    """
    check_jobs(jobs, threads)
    exit_if_importing_main(jobs)
    if not items:
        return
    if jobs == 1:
        _in_this_process(fn, items, threads, setup, setup_args, on_event, on_result)
    else:
        _in_processes(fn, items, min(jobs, len(items)), threads, setup, setup_args, on_event, on_result)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system tells it, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def default_jobs(device: str) -> int:
    """The runs a command-line sweep does at once when ``--jobs`` is not given, for its runs' ``device``
    (``"auto"``, ``"cpu"`` or ``"cuda"``): on the CPU one per usable core, each on one torch thread; on a GPU 1.

    On the CPU that is the fastest setting measured (``results/drift_probe_timing.csv``, 2 cores): two one-thread
    runs side by side each kept the pace of one alone, while one run on two threads went only about 1.4 times
    as fast as on one. One process holds a GPU's work already."""
    on_gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return 1 if on_gpu else usable_cores()


def check_jobs(jobs: Any, threads: Any = None) -> None:
    """One-line :class:`FeddrKitError` unless ``jobs`` is an integer >= 1 and ``threads`` None or one."""
    for name, value in (("jobs", jobs), ("threads", threads)):
        if (value is not None or name == "jobs") and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise FeddrKitError(f"{name} must be an integer >= 1, got {value!r}")


def exit_if_importing_main(jobs: Any) -> None:
    """In a process that ``spawn`` is starting, end it quietly when asked for ``jobs > 1``.

    Such a process imports the main script to find the task's functions; a call with ``jobs > 1`` there
    comes from the script's module level, which lacks ``if __name__ == "__main__":``. Going on would start
    processes from every process, each failing with a traceback; this one exits with
    :data:`IMPORTING_MAIN_EXIT` instead, by which the parent names the cause in one line.
    """
    if isinstance(jobs, int) and jobs > 1 and getattr(multiprocessing.current_process(), "_inheriting", False):
        os._exit(IMPORTING_MAIN_EXIT)


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
    pool = _Pool((fn, threads, setup, setup_args))
    try:
        try:
            pool.start(jobs)
            pool.run(items, on_event, on_result)
        except BaseException:
            pool.stop()
            raise
    finally:
        pool.close()


class _Worker:
    """A task process as the parent sees it: the process, its two pipes, the task it runs (or None)."""

    def __init__(self, spawn: Any, work_args: tuple):
        task_end, self.tasks = spawn.Pipe(duplex=False)
        self.reports, report_end = spawn.Pipe(duplex=False)
        self.process = spawn.Process(target=_work, args=(task_end, report_end, os.getpid(), *work_args), daemon=True)
        self.index: int | None = None
        self.open = True  # its reports can still be read
        try:
            self.process.start()
        finally:  # the process holds its own ends: with ours closed, each side sees the other end
            task_end.close()
            report_end.close()

    def tell(self, message: Any) -> bool:
        """Send ``message``; False when the process is gone."""
        try:
            self.tasks.send(message)
            return True
        except OSError:
            return False

    def lost(self) -> bool:
        """A task out, and the process ended or its pipe broken (its last messages already read)."""
        return self.index is not None and (not self.open or self.process.exitcode is not None)

    def close(self) -> None:
        """Close the pipes, and the process's handles once it has ended."""
        for end in (self.tasks, self.reports):
            end.close()
        if self.process.exitcode is not None:
            self.process.close()


class _Pool:
    """The task processes of one :func:`run_each`: started, handed tasks, stopped, and always ended."""

    def __init__(self, work_args: tuple):
        self.work_args, self.workers, self.stopped = work_args, [], False

    def start(self, jobs: int) -> None:
        """Start ``jobs`` processes, which inherit SIGINT ignored (see the module's docstring)."""
        spawn = multiprocessing.get_context("spawn")
        with _sigint_ignored():
            for _ in range(jobs):
                try:
                    self.workers.append(_Worker(spawn, self.work_args))
                except OSError as err:  # e.g. it ended before reading all it was started with
                    raise FeddrKitError(f"a task's process could not be started ({type(err).__name__}: {err}); if "
                                        f"{_main_script()} starts this at its module level, "
                                        'put that call under `if __name__ == "__main__":`') from None

    def run(self, items: Sequence[Any], on_event, on_result) -> None:
        """Hand out every item, each to the next free process, until all have ended; raises as run_each says
        (the first task's exception, once every message that came with it is handled)."""
        todo = collections.deque(enumerate(items))
        for worker in self.workers:
            self._hand(worker, todo)
        while any(w.index is not None for w in self.workers):
            failure = None
            for worker, message in self._read(POLL_S):
                kind, index = message[0], message[1]
                if kind == "event":
                    on_event(index, message[2])
                elif kind == "warning":
                    warnings.warn(message[2], message[3], stacklevel=2)
                elif kind == "raised":
                    self.stopped = True  # nothing more is handed out
                    if failure is None:
                        failure = _with_remote_traceback(message[2], message[3])
                else:  # "done" or "skipped"
                    if kind == "done":
                        on_result(index, message[2])
                    self._hand(worker, todo)
            if failure is not None:
                raise failure
            lost = next((w for w in self.workers if w.lost()), None)
            if lost is not None:
                raise _lost_error(lost)

    def _hand(self, worker: _Worker, todo: collections.deque) -> None:
        if todo and not self.stopped:
            index, item = todo.popleft()
            worker.index = index
            worker.tell((index, item))  # a process that is gone shows as lost on the next look

    def _read(self, timeout: float) -> list[tuple[_Worker, tuple]]:
        """Every message that has arrived, with its process, waiting up to ``timeout`` s for the first (or
        for a process to end). A process whose task's end is read is free again at once, whatever the
        caller does with the message."""
        handles = [w.reports for w in self.workers if w.open]
        handles += [w.process.sentinel for w in self.workers if w.process.exitcode is None]
        connection.wait(handles, timeout)
        out = []
        for worker in self.workers:
            while worker.open and worker.reports.poll():
                try:
                    message = worker.reports.recv()
                except Exception:  # EOF: the process is gone; anything else: a broken pipe, as good as gone
                    worker.open = False
                    break
                if message[0] in ("done", "skipped", "raised"):
                    worker.index = None
                out.append((worker, message))
        return out

    def stop(self) -> None:
        """No task starts any more; the running ones are interrupted and waited for, at most :data:`UNWIND_S`.
        A second Ctrl-C meanwhile kills every process."""
        self.stopped = True
        try:
            for worker in self.workers:
                worker.tell(_STOP)  # before the SIGINT: a task that takes SIGINT after it still sees the stop
            for worker in self.workers:
                if worker.index is not None:
                    _signal(worker.process.pid, signal.SIGINT)
            deadline = time.monotonic() + UNWIND_S
            while any(w.index is not None for w in self.workers) and time.monotonic() < deadline:
                for _, message in self._read(POLL_S):
                    if message[0] == "warning":
                        warnings.warn(message[2], message[3], stacklevel=2)
                for worker in self.workers:
                    if worker.lost():
                        worker.index = None
        except KeyboardInterrupt:
            self._kill()
            raise

    def close(self) -> None:
        """Every process told to exit and waited for (:data:`EXIT_S`), then killed: none outlives this call."""
        try:
            for worker in self.workers:
                worker.tell(_EXIT)
            self._join(EXIT_S)
        except KeyboardInterrupt:
            self._kill()
            raise
        finally:
            self._kill()
            for worker in self.workers:
                worker.close()

    def _kill(self) -> None:
        for worker in self.workers:
            if worker.process.exitcode is None:
                worker.process.kill()
        self._join(EXIT_S)

    def _join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for every process to end, reading (and dropping) what they still send, so
        that none waits on a full pipe."""
        deadline = time.monotonic() + timeout
        while any(w.process.exitcode is None for w in self.workers) and time.monotonic() < deadline:
            self._read(min(POLL_S, max(0.0, deadline - time.monotonic())))


def _lost_error(worker: _Worker) -> FeddrKitError:
    """The error for a process that ended with its task out: the main guard missing, else how it ended."""
    worker.process.join(1.0)  # a killed process closes its pipe a moment before its exit status shows
    code = worker.process.exitcode
    if code == IMPORTING_MAIN_EXIT:
        return FeddrKitError(_guard_advice())
    if code is None:
        how = "its pipe broke"
    elif code < 0:
        how = f"killed by {signal.Signals(-code).name}"
    else:
        how = f"exit status {code}"
    return WorkerLostError(f"the process of task {worker.index} ended abruptly ({how}; was it killed, or out of "
                           "memory?); what it held is left as a killed run leaves it: run the same again to go on")


def _guard_advice() -> str:
    return (f"jobs > 1 starts each process by importing {_main_script()}, which calls this again at its module "
            'level: put that call under `if __name__ == "__main__":`')


def _main_script() -> str:
    return getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"


def _with_remote_traceback(exc: BaseException, text: str) -> BaseException:
    """``exc`` with the task process's traceback as its cause (as ``concurrent.futures`` shows it)."""
    if text:
        exc.__cause__ = _RemoteTraceback(text)
    return exc


class _RemoteTraceback(Exception):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended meanwhile
        pass


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
class _Child:
    """What a task process holds: its pipe to the parent, its context, and what the parent said meanwhile."""
    reports: Any = None
    context: Any = None
    built: bool = False
    told: str | None = None


def _work(tasks, reports, parent: int, fn, threads: int | None, setup, setup_args: tuple) -> None:
    """A task process: run the tasks the parent sends until it says to exit, or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited so; set again in case it was started otherwise
    _Child.reports = reports
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if threads is not None:
        torch.set_num_threads(threads)
    while _Child.told != _EXIT:
        message = _receive(tasks)
        if message in (_STOP, _EXIT, None):  # None: the parent is gone
            _Child.told = _STOP if message == _STOP else _EXIT
            continue
        index, item = message
        try:
            outcome = _task(tasks, fn, index, item, setup, setup_args)
        except KeyboardInterrupt:  # one that came as the task ended
            outcome = ("raised", index, KeyboardInterrupt(), "")
        if not _send(outcome):
            return


def _task(tasks, fn, index: int, item: Any, setup, setup_args: tuple) -> tuple:
    """Run one task, interruptible while it runs; returns the message that says how it ended."""
    _take_signals(_interrupted, _interrupted)  # before the stop is looked for: a stop sent after it interrupts
    try:
        if _stop_sent(tasks):
            return ("skipped", index)
        if not _Child.built:
            _Child.context, _Child.built = (setup(*setup_args) if setup is not None else None), True

        def emit(event: tuple) -> None:
            if not _send(("event", index, event)):  # the parent is gone: nobody will show this task
                _interrupted(signal.SIGINT, None)

        with warnings.catch_warnings():
            warnings.showwarning = lambda message, category, *args, **kwargs: _send(
                ("warning", index, str(message), category))
            return ("done", index, fn(item, emit, _Child.context))
    except BaseException as exc:  # KeyboardInterrupt too: the parent raises it
        return ("raised", index, exc, traceback.format_exc())
    finally:
        _take_signals(signal.SIG_IGN, signal.SIG_DFL)  # between tasks nothing is held: SIGTERM may end it


def _stop_sent(tasks) -> bool:
    """Whether the parent said to stop or exit (or is gone) since this task was handed out."""
    if tasks.poll():
        message = _receive(tasks)
        _Child.told = _STOP if message == _STOP else _EXIT
        return True
    return False


def _receive(tasks) -> Any:
    try:
        return tasks.recv()
    except Exception:  # EOF: the parent is gone; anything else: a broken pipe, as good as gone
        return None


def _send(message: tuple) -> bool:
    """Send ``message`` to the parent; False when the parent is gone. What does not pickle (a result, an
    exception of a class defined in a notebook) goes as a RuntimeError saying what it was."""
    try:
        _Child.reports.send(message)
        return True
    except OSError:
        return False
    except Exception as err:
        if message[0] not in ("done", "raised"):
            raise
        what = message[2]
        text = f"{type(what).__name__}: {what}" if message[0] == "raised" else f"the task's result cannot be sent ({err})"
        return _send(("raised", message[1], RuntimeError(text[:2000]), message[3] if len(message) > 3 else ""))


def _take_signals(on_sigint: Any, on_sigterm: Any) -> None:
    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigterm)


def _interrupted(signum: int, frame: Any) -> None:
    _take_signals(signal.SIG_IGN, signal.SIG_IGN)  # one interrupt: what the task holds is released undisturbed
    raise KeyboardInterrupt


def _watch_parent(parent: int) -> None:
    """A task process's watch on its parent: once the parent is gone (the pipe the process was started
    through closes with it), interrupt the task under way, which releases what it holds, and exit
    :data:`ORPHAN_GRACE_S` later whatever it does."""
    process = multiprocessing.parent_process()
    sentinels = [process.sentinel] if process is not None else []
    while os.getppid() == parent and not connection.wait(sentinels, WATCH_S):
        pass
    os.kill(os.getpid(), signal.SIGINT)  # between tasks it is ignored, and the main thread finds the pipe closed
    time.sleep(ORPHAN_GRACE_S)
    os._exit(1)
