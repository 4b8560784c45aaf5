"""Side-by-side sweeps that end: a task's failure never hangs the sweep, no process outlives a killed sweep,
exit codes say what happened, a full disk leaves its run resumable, a script without the main guard gets one
line; and sweep behaviours no other test pinned (threads put back, nothing starts after Ctrl-C, retry of the
failed runs only, grid fields in another order). Tiny synthetic federations, as in tests/test_sweep.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import feddr_kit as fk
from feddr_kit import sweep
from feddr_kit.sweep import running
from feddr_kit.__main__ import main as kit_main
from feddr_kit.errors import FeddrKitError, StorageError
from feddr_kit.sweep.root import status
from test_sweep import _left_after  # the process table's reader, shared

REPO = Path(__file__).resolve().parents[1]
BASE = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2,
            local_epochs=1, eval_every=1, checkpoint_every=1, lr=0.05)
# Two runs told apart by their history rows' lr: the first grid value is the one a test makes fail or interrupt.
LRS = {"lr": [0.05, 0.04]}
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
# The environment variable naming the marker file the second run touches at each round (see _first_run).
MARK = "FEDDR_TEST_SECOND_RUN_STARTED"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    return fk.data.synthetic(train_per_class=20, test_per_class=10)


@contextlib.contextmanager
def hang_guard(seconds: int):
    """Fails the test instead of hanging it: SIGALRM after ``seconds`` raises in the main thread."""
    def expired(signum, frame):
        raise TimeoutError(f"still waiting after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _first_run(row: dict) -> bool:
    """Whether ``row`` is the first round of the run at the first lr of :data:`LRS`. In the other run's
    processes, with :data:`MARK` set, it touches the marker at every round, so that the first run can wait
    until the other is under way."""
    if row["round"] == 1 and abs(row["lr"] - LRS["lr"][0]) < 1e-9:
        marker = os.environ.get(MARK)
        deadline = time.monotonic() + 60
        while marker and not Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return True
    if os.environ.get(MARK):
        Path(os.environ[MARK]).touch()
    return False


def fail_first_run(row: dict) -> None:
    """A callback (module-level: it reaches the runs' processes) whose first run meets a full disk once the
    other run is under way."""
    if _first_run(row):
        raise StorageError("cannot write checkpoint.pt (No space left on device; 0.0 MiB free there)")


def interrupt_first_run(row: dict) -> None:
    """A callback that presses Ctrl-C in the first run (once the other is under way, with :data:`MARK` set)."""
    if _first_run(row):
        raise KeyboardInterrupt


def record_threads(row: dict) -> None:
    """A callback that records the torch threads its run trains on."""
    THREADS_SEEN.append(torch.get_num_threads())


THREADS_SEEN: list[int] = []


def _workers_of(pid: int) -> list[int]:
    """The task processes a sweep started (multiprocessing's resource tracker left out)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(proc.name))
    return found


def _grid_file(path: Path, base: dict, grid: dict, seeds=(0,)) -> Path:
    path.write_text(json.dumps({"base": base, "grid": grid, "seeds": list(seeds)}))
    return path


@contextlib.contextmanager
def _sweep_process(tmp_path: Path, base: dict, *flags: str, preexec=None):
    """A command-line sweep of :data:`LRS` with ``--jobs 2`` in a process group of its own; yields
    ``(process, root, command)`` and kills the group whatever the test does."""
    root = tmp_path / "root"
    cmd = [sys.executable, "-m", "feddr_kit", "sweep", "--grid", str(_grid_file(tmp_path / "grid.json", base, LRS)),
           "--root", str(root), "--jobs", "2", "--no-progress", *flags]
    process = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=preexec)
    try:
        yield process, root, cmd
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def _wait_until_both_run(process: subprocess.Popen, root: Path, seconds: float = 240) -> list[Path]:
    """Wait until both runs have a checkpoint and no summary; returns their folders."""
    deadline, under_way = time.monotonic() + seconds, []
    while len(under_way) < 2 and process.poll() is None and time.monotonic() < deadline:
        under_way = [p.parent for p in root.glob("*/checkpoint.pt") if not (p.parent / "summary.json").exists()]
        time.sleep(0.02)
    assert len(under_way) == 2, process.communicate(timeout=60)
    return under_way


# --------------------------------------------------------------------------- a failing task never hangs the sweep
def test_a_task_failing_while_another_runs_never_hangs_the_sweep(tmp_path, tiny, monkeypatch):
    """One run meets a full disk while the other is under way, three times over (the old pool hung in 1 of 3
    tries): each time the sweep raises the StorageError, releases both runs and marks neither failed."""
    base = {**BASE, "rounds": 200}
    for attempt in range(3):
        root = tmp_path / f"try{attempt}"
        monkeypatch.setenv(MARK, str(tmp_path / f"second-run-started-{attempt}"))
        with hang_guard(120), pytest.raises(StorageError, match="No space left on device"):
            sweep.run(base, LRS, [0], root, data=tiny, progress=False, jobs=2, callback=fail_first_run)
        assert not list(root.glob("**/.lock")), attempt  # both runs released
        assert not list(root.glob("**/error.txt")), attempt  # neither marked failed: both resume next time
        assert set(sweep.collect(root)["status"]) == {"partial"}, attempt  # the other one stopped, not run to its end


# --------------------------------------------------------------------------- no process outlives the sweep
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_process_outlives_a_killed_sweep_parent(tmp_path, signum):
    """The parent alone is killed while both runs are under way: its processes release their runs and exit
    within seconds. SIGTERM is taken as Ctrl-C: exit 130 and its one line."""
    with _sweep_process(tmp_path, {**BASE, "rounds": 300}) as (process, root, _):
        _wait_until_both_run(process, root)
        os.kill(process.pid, signum)
        # The runs' processes write to the same pipes: they close when the last process holding them exits.
        _, err = process.communicate(timeout=60)
        assert not _left_after(process.pid, 15), err  # every process of the sweep gone, the resource tracker too
        assert not list(root.glob("**/.lock")), err  # each run released its folder on the way out
        assert not list(root.glob("*/summary.json")), err  # stopped, not run to the end
        if signum == signal.SIGTERM:
            assert process.returncode == 130, err
            assert "interrupted: the last checkpoint is kept" in err and "Traceback" not in err, err


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_a_killed_run_process_ends_the_sweep_as_a_lost_process_not_bad_input(tmp_path):
    """kill -9 to one run's process: exit 1 (not 2, bad input) with one line saying so, the other run released,
    nothing left running, neither run marked failed."""
    with _sweep_process(tmp_path, {**BASE, "rounds": 300}) as (process, root, _):
        _wait_until_both_run(process, root)
        workers = _workers_of(process.pid)
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 1, err
        assert err.splitlines() == [err.strip()] and "ended abruptly (killed by SIGKILL" in err, err
        assert not _left_after(process.pid, 15), err
        assert len(list(root.glob("*/.lock"))) <= 1  # the killed run's lock file, stale, is taken over next time
        assert not list(root.glob("*/error.txt")) and not list(root.glob("*/summary.json"))  # both resumable


# --------------------------------------------------------------------------- exit codes
def _file_size_limit(limit: int):
    """A ``preexec_fn`` that caps the size of any file the process (and what it starts) writes: a full disk
    for every file larger than ``limit`` bytes (Python ignores SIGXFSZ, so a write fails with EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_full_disk_in_a_jobs_sweep_is_exit_3_naming_the_file_and_the_run_resumes(tmp_path):
    """Checkpoints do not fit (the config and point files do): exit 3, one line naming the file; no run is
    marked failed, so the same command without the limit runs both to their end."""
    with _sweep_process(tmp_path, BASE, preexec=_file_size_limit(32 * 1024)) as (process, root, cmd):
        out, err = process.communicate(timeout=300)
    assert process.returncode == 3, (out, err)
    assert err.splitlines() == [err.strip()] and err.startswith("error: cannot write "), err
    assert "checkpoint.pt" in err and "error.txt" not in err, err
    assert not list(root.glob("*/error.txt")) and not list(root.glob("**/.lock"))
    again = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "2 of 2 runs done" in again.stdout and "skipped" not in again.stdout + again.stderr


def test_a_script_without_the_main_guard_gets_one_line_saying_to_add_it(tmp_path):
    """``fk.sweep.run(..., jobs=2)`` at a script's module level: each process that imports the script exits
    quietly, and the script's own error names the guard (no traceback from the processes, no blame on memory)."""
    script = tmp_path / "unguarded.py"
    script.write_text("import feddr_kit as fk\n"
                      f"fk.sweep.run({BASE!r}, {LRS!r}, [0], {str(tmp_path / 'root')!r}, progress=False, jobs=2)\n")
    done = subprocess.run([sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("Traceback") == 1, done.stderr  # the script's own, for its uncaught error
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("feddr_kit.errors.FeddrKitError: jobs > 1 starts each process by importing"), last
    assert 'put that call under `if __name__ == "__main__":`' in last and "memory" not in done.stderr, last
    assert not list((tmp_path / "root").glob("*/point.json"))  # no run started


# --------------------------------------------------------------------------- behaviours no other test pinned
def test_jobs_1_with_threads_puts_the_callers_torch_threads_back(tmp_path, tiny):
    """The runs train on ``threads``; afterwards, and after an interrupt too, this process has its own again."""
    assert torch.get_num_threads() == 1  # the module's fixture
    THREADS_SEEN.clear()
    sweep.run(BASE, {"algorithm": ["fedavg"]}, [0], tmp_path / "a", data=tiny, progress=False, threads=2,
              callback=record_threads)
    assert THREADS_SEEN == [2, 2] and torch.get_num_threads() == 1
    with pytest.raises(KeyboardInterrupt):
        sweep.run(BASE, LRS, [0], tmp_path / "b", data=tiny, progress=False, threads=2, callback=interrupt_first_run)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("jobs", [1, 2])
def test_after_ctrl_c_no_run_that_had_not_started_starts(tmp_path, tiny, monkeypatch, jobs):
    """Ctrl-C in the first run: the runs not yet started never start (with jobs=2 the other run under way
    is stopped, and the two of the second seed are never handed out)."""
    if jobs == 2:  # the first run waits until the second is under way, so that both are
        monkeypatch.setenv(MARK, str(tmp_path / "second-run-started"))
    base = {**BASE, "rounds": 30}
    with hang_guard(180), pytest.raises(KeyboardInterrupt):
        sweep.run(base, LRS, [0, 1], tmp_path / "root", data=tiny, progress=False, jobs=jobs,
                  callback=interrupt_first_run)
    names = [sweep.run_dir_name(c, base, LRS) for c in sweep.expand(base, LRS, [0, 1])]
    not_started = names[jobs:]
    assert [status(tmp_path / "root" / name) for name in not_started] == [None] * len(not_started)
    assert not list((tmp_path / "root").glob("**/.lock"))


def test_retry_failed_reruns_the_failed_runs_and_only_them(tmp_path, tiny, monkeypatch, capsys):
    real = running.run_one
    calls = []

    def diverge_once(cfg, **kw):  # a run at lr 0.03 "diverges" the first time, as a flaky node might make it
        if cfg.lr == 0.03:
            raise FloatingPointError("the local loss became nan at lr=0.03")
        return real(cfg, **kw)

    def counted(cfg, **kw):
        calls.append(Path(cfg.out_dir).name)
        return real(cfg, **kw)

    grid = {"lr": [0.03, 0.05]}
    for root in (tmp_path / "api", tmp_path / "cli"):
        monkeypatch.setattr(running, "run_one", diverge_once)
        assert list(sweep.run(BASE, grid, [0], root, data=tiny, progress=False)["status"]) == ["failed", "done"]
        monkeypatch.setattr(running, "run_one", counted)
    calls.clear()
    sweep.run(BASE, grid, [0], tmp_path / "api", data=tiny, progress=False)
    assert calls == []  # a failed run is skipped unless asked
    df = sweep.run(BASE, grid, [0], tmp_path / "api", data=tiny, progress=False, retry_failed=True)
    assert calls == ["lr=0.03__seed=0"] and list(df["status"]) == ["done", "done"]
    calls.clear()
    cmd = ["sweep", "--grid", str(_grid_file(tmp_path / "grid.json", BASE, grid)), "--root", str(tmp_path / "cli"),
           "--no-progress", "--jobs", "1"]  # in this process, where calls are counted
    assert kit_main(cmd) == 1 and calls == []  # still failed: exit 1, nothing rerun
    assert kit_main(cmd + ["--retry-failed"]) == 0, capsys.readouterr().err
    assert calls == ["lr=0.03__seed=0"]


def test_a_root_accepts_the_same_grid_fields_in_another_order(tmp_path, tiny, monkeypatch):
    base = {**BASE, "rounds": 1}
    sweep.run(base, {"algorithm": ["fedavg"], "lr": [0.05]}, [0], tmp_path, data=tiny, progress=False)
    before = (tmp_path / "sweep.json").read_bytes()
    monkeypatch.setattr(running, "run_one", lambda *a, **k: pytest.fail("a finished run was run again"))
    df = sweep.run(base, {"lr": [0.05], "algorithm": ["fedavg"]}, [0], tmp_path, data=tiny, progress=False)
    assert list(df["status"]) == ["done"] and list(df["name"]) == ["algorithm=fedavg__lr=0.05__seed=0"]
    assert (tmp_path / "sweep.json").read_bytes() == before
    with pytest.raises(FeddrKitError, match="vary different fields"):  # another set of fields is still refused
        sweep.run(base, {"lr": [0.05]}, [0], tmp_path, data=tiny, progress=False)
