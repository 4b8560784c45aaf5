"""feddr_kit.sweep: grid expansion, stable folder names, skip / resume, collect / table, the CLI,
and the papermill grid. Runs are tiny synthetic federations (2 rounds, 2 clients of 10)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit import sweep
from feddr_kit.sweep import running
from feddr_kit.errors import FeddrKitError

REPO = Path(__file__).resolve().parents[1]
BASE = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2, local_epochs=1,
            eval_every=1, checkpoint_every=1, lr=0.05)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    return fk.data.synthetic(train_per_class=20, test_per_class=10)


@pytest.fixture
def counted(monkeypatch):
    """Wraps the sweep's call of fk.run; returns the list of (folder name, resume) it was called with."""
    calls = []
    real = running.run_one

    def spy(cfg, **kw):
        calls.append((Path(cfg.out_dir).name, kw.get("resume", False)))
        return real(cfg, **kw)

    monkeypatch.setattr(running, "run_one", spy)
    return calls


# --------------------------------------------------------------------------- expansion and names
def test_expand_counts_and_orders_the_grid():
    cfgs = sweep.expand(BASE, {"algorithm": ["fedavg", "dr", "feddr+"], "shards_per_client": [2, 5]}, seeds=[3, 1])
    got = [(c.algorithm, c.shards_per_client, c.seed) for c in cfgs]
    expected = [(a, s, seed) for seed in (3, 1) for a in ("fedavg", "dr", "feddr+") for s in (2, 5)]
    assert got == expected
    assert all(c.rounds == 2 and c.num_clients == 10 and c.out_dir is None for c in cfgs)


@pytest.mark.parametrize("base, grid, seeds, match", [
    (BASE, {"clients_per_round": [2, 11]}, [0], r"grid point \{'clients_per_round': 11\} with seed 0: clients_per_round"),
    (BASE, {"algoritm": ["dr"]}, [0], "unknown config field.*algoritm"),
    ({**BASE, "lerning_rate": 1}, {}, [0], "base names unknown.*lerning_rate"),
    (BASE, {"seed": [0, 1]}, [0], "seeds list"),
    (BASE, {"algorithm": ["dr", "dr"]}, [0], "'dr' twice"),
    (BASE, {"algorithm": []}, [0], "non-empty list"),
    (BASE, {"algorithm": ["dr"]}, [], "seeds must be a non-empty"),
    (BASE, {"algorithm": ["dr"]}, [0, 0], "distinct"),
    ({**BASE, "out_dir": "x"}, {}, [0], "out_dir"),
])
def test_expand_rejects_bad_grids_naming_the_field(base, grid, seeds, match):
    with pytest.raises(FeddrKitError, match=match):
        sweep.expand(base, grid, seeds)


def test_run_dir_names_readable_distinct_and_safe():
    grid = {"algorithm": ["fedavg", "feddr+"], "shards_per_client": [2, 5]}
    cfgs = sweep.expand(BASE, grid, [0, 1])
    names = [sweep.run_dir_name(c, BASE, grid) for c in cfgs]
    assert len(set(names)) == len(names)
    assert "algorithm=feddr+__shards_per_client=5__seed=1" in names
    assert "algorithm=fedavg__shards_per_client=2__seed=0" in names
    # without the grid, only fields that differ from the base show (feddr+ and s=2 are defaults)
    assert sweep.run_dir_name(cfgs[0].replace(algorithm="feddr+"), BASE) == "seed=0"
    weird = fk.Config(**{**BASE, "dataset": "imagefolder", "data_path": "/data/my images", "lr": 1e-05})
    name = sweep.run_dir_name(weird, BASE)
    assert name.startswith("data_path=-data-my-images__dataset=imagefolder__lr=1e-05__seed=0__")
    assert len(name.rsplit("__", 1)[1]) == 10  # the digest, since characters were replaced
    long = fk.Config(**{**BASE, "lr_decay_at": tuple(0.01 * k for k in range(1, 60))})
    assert len(sweep.run_dir_name(long, BASE)) <= 120


# --------------------------------------------------------------------------- running, skipping, resuming
def test_finished_runs_are_skipped(tmp_path, tiny, counted):
    grid = {"algorithm": ["fedavg", "dr"]}
    df = sweep.run(BASE, grid, [0], tmp_path, data=tiny, progress=False)
    assert list(df["status"]) == ["done", "done"] and len(counted) == 2
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/summary.json")}
    df2 = sweep.run(BASE, grid, [0], tmp_path, data=tiny, progress=False)
    assert len(counted) == 2  # nothing retrained
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/summary.json")} == mtimes
    pd.testing.assert_frame_equal(df, df2)
    # the layout is written out at auto (None), since a base that leaves it out reads as the former NCHW
    assert json.loads((tmp_path / "sweep.json").read_text()) == {"base": {**BASE, "channels_last": None}, "grid": grid,
                                                                 "seeds": [0]}


def test_a_folder_holding_another_config_is_an_error(tmp_path, tiny):
    sweep.run(BASE, {"algorithm": ["fedavg"]}, [0], tmp_path, data=tiny, progress=False)
    with pytest.raises(FeddrKitError, match="rounds=2 there but rounds=3 here"):  # the root's grid says so first
        sweep.run({**BASE, "rounds": 3}, {"algorithm": ["fedavg"]}, [0], tmp_path, data=tiny, progress=False)
    (tmp_path / "sweep.json").unlink()  # a root written before sweep.json existed: the folder itself says so
    with pytest.raises(FeddrKitError, match="rounds=2 there but the sweep asks rounds=3"):
        sweep.run({**BASE, "rounds": 3}, {"algorithm": ["fedavg"]}, [0], tmp_path, data=tiny, progress=False)


def test_interrupted_sweep_resumes_to_the_uninterrupted_histories(tmp_path, tiny, counted):
    base, grid = {**BASE, "rounds": 3}, {"algorithm": ["fedavg", "feddr+"]}
    sweep.run(base, grid, [0], tmp_path / "straight", data=tiny, progress=False)

    evaluated = []

    def kill_in_second_run(row):  # the process "dies" after round 2 of the second run
        evaluated.append(row["round"])
        if len(evaluated) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run(base, grid, [0], tmp_path / "killed", data=tiny, progress=False, callback=kill_in_second_run)
    second = tmp_path / "killed" / "algorithm=feddr+__seed=0"
    assert (second / "checkpoint.pt").exists() and not (second / "summary.json").exists()
    assert sweep.collect(tmp_path / "killed").set_index("name")["status"].to_dict() == {
        "algorithm=fedavg__seed=0": "done", "algorithm=feddr+__seed=0": "partial"}

    counted.clear()
    df = sweep.run(base, grid, [0], tmp_path / "killed", data=tiny, progress=False)
    assert counted == [("algorithm=feddr+__seed=0", True)]  # only the interrupted run, resumed
    assert list(df["status"]) == ["done", "done"]
    for name in df["name"]:
        a = pd.read_csv(tmp_path / "straight" / name / "history.csv").drop(columns="seconds")
        b = pd.read_csv(tmp_path / "killed" / name / "history.csv").drop(columns="seconds")
        pd.testing.assert_frame_equal(a, b)


def test_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path, tiny, monkeypatch):
    real = running.run_one

    def diverge_at_high_lr(cfg, **kw):
        if cfg.lr == 0.5:
            raise FloatingPointError("round 1, client 3: the local loss became nan at lr=0.5")
        return real(cfg, **kw)

    monkeypatch.setattr(running, "run_one", diverge_at_high_lr)
    df = sweep.run(BASE, {"lr": [0.5, 0.05]}, [0], tmp_path, data=tiny, progress=False)
    assert list(df["status"]) == ["failed", "done"]
    assert df.loc[0, "error"] == "FloatingPointError: round 1, client 3: the local loss became nan at lr=0.5"
    assert df.loc[0, "lr"] == 0.5  # the failed run's config is still reported
    monkeypatch.setattr(running, "run_one", lambda *a, **k: pytest.fail("a failed run was retried"))
    sweep.run(BASE, {"lr": [0.5, 0.05]}, [0], tmp_path, data=tiny, progress=False)


# --------------------------------------------------------------------------- runs side by side (jobs)
TIMING = ["seconds", "sec_per_round", "total_seconds"]


def _finished_runs(root: Path) -> dict[str, tuple[pd.DataFrame, dict]]:
    """Every finished run's history and summary, timings left out."""
    out = {}
    for folder in sorted(p for p in root.iterdir() if (p / "summary.json").exists()):
        summary = {k: v for k, v in json.loads((folder / "summary.json").read_text()).items() if k not in TIMING}
        out[folder.name] = (pd.read_csv(folder / "history.csv").drop(columns="seconds"), summary)
    return out


def _assert_same_runs(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        pd.testing.assert_frame_equal(a[name][0], b[name][0], check_exact=True, obj=name)  # bit for bit
        assert a[name][1] == b[name][1], name


def _grid_file(path: Path, base: dict, grid: dict, seeds=(0,)) -> Path:
    path.write_text(json.dumps({"base": base, "grid": grid, "seeds": list(seeds)}))
    return path


def report_threads(row):
    """A callback that ends its run with the torch threads of the process it runs in (module-level: it pickles)."""
    raise FeddrKitError(f"this run had {torch.get_num_threads()} torch thread(s)")


def test_jobs_2_gives_the_serial_numbers_bit_for_bit(tmp_path, tiny):
    grid = {"algorithm": ["fedavg", "dr"]}
    serial = sweep.run(BASE, grid, [0, 1], tmp_path / "serial", data=tiny, progress=False)  # one torch thread here
    side = sweep.run(BASE, grid, [0, 1], tmp_path / "side", data=tiny, progress=False, jobs=2)  # one per run by default
    assert list(side["name"]) == list(serial["name"]) and set(side["status"]) == {"done"}
    _assert_same_runs(_finished_runs(tmp_path / "serial"), _finished_runs(tmp_path / "side"))
    pd.testing.assert_frame_equal(serial.drop(columns=TIMING[1:]), side.drop(columns=TIMING[1:]), check_exact=True)


def test_jobs_run_each_run_on_the_threads_asked_one_by_default(tmp_path, tiny):
    base = {**BASE, "rounds": 1}
    df = sweep.run(base, {"algorithm": ["fedavg", "dr"]}, [0], tmp_path / "a", data=tiny, progress=False, jobs=2,
                   callback=report_threads)
    assert list(df["error"]) == ["FeddrKitError: this run had 1 torch thread(s)"] * 2
    df = sweep.run(base, {"algorithm": ["fedavg"]}, [0], tmp_path / "b", data=tiny, progress=False, jobs=2, threads=2,
                   callback=report_threads)
    assert list(df["error"]) == ["FeddrKitError: this run had 2 torch thread(s)"]
    with pytest.raises(FeddrKitError, match="callback: with jobs > 1 .* module-level function"):
        sweep.run(base, {"algorithm": ["fedavg"]}, [0], tmp_path / "c", data=tiny, jobs=2, callback=lambda row: None)
    with pytest.raises(FeddrKitError, match="jobs must be an integer >= 1, got 0"):
        sweep.run(base, {"algorithm": ["fedavg"]}, [0], tmp_path / "c", data=tiny, jobs=0)


def test_command_line_jobs_default_to_one_run_per_core_on_the_cpu_and_one_on_a_gpu(tmp_path, monkeypatch):
    from feddr_kit.__main__ import main
    from feddr_kit.sweep import cli, workers

    asked = []
    monkeypatch.setattr(cli, "run_sweep", lambda *a, jobs, **kw: asked.append(jobs) or pd.DataFrame())
    monkeypatch.setattr(workers, "usable_cores", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def jobs_for(spec: dict, *flags: str) -> int:
        grid = tmp_path / f"grid{len(asked)}.json"
        grid.write_text(json.dumps({"seeds": [0], **spec}))
        assert main(["sweep", "--grid", str(grid), "--root", str(tmp_path / "root"), "--no-progress", *flags]) == 0
        return asked[-1]

    assert jobs_for({"base": BASE}) == 3  # one run per core, each on one thread (run_sweep's default for jobs > 1)
    assert jobs_for({"base": {**BASE, "device": "cuda"}}) == 1
    assert jobs_for({"base": BASE, "grid": {"device": ["cpu", "cuda"]}}) == 1  # any run on a GPU: one at a time
    assert jobs_for({"base": BASE}, "--jobs", "2") == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert jobs_for({"base": BASE}) == 1  # device "auto" finds the GPU


def test_jobs_leave_a_folder_that_another_process_holds_untouched(tmp_path, tiny):
    from feddr_kit import rundir

    grid, held = {"algorithm": ["fedavg", "dr"]}, tmp_path / "algorithm=dr__seed=0"
    with rundir.claim(held, resume=False, overwrite=False):  # a live run, to the sweep's processes another process
        (held / "config.json").write_text(fk.Config(**BASE, algorithm="dr").to_json())
        before = {p.name: p.read_bytes() for p in held.iterdir()}
        df = sweep.run(BASE, grid, [0], tmp_path, data=tiny, progress=False, jobs=2)
        assert {p.name: p.read_bytes() for p in held.iterdir()} == before  # no point.json, no error.txt, no run
        assert dict(zip(df["name"], df["status"])) == {"algorithm=fedavg__seed=0": "done", "algorithm=dr__seed=0": "partial"}
    df = sweep.run(BASE, grid, [0], tmp_path, data=tiny, progress=False, jobs=2)  # once it is free, the sweep runs it
    assert list(df["status"]) == ["done", "done"]


def test_jobs_show_the_progress_of_every_run(tmp_path, tiny, monkeypatch, capsys):
    monkeypatch.setenv("FEDDR_PROGRESS", "lines")  # as in a log: plain lines
    sweep.run(BASE, {"algorithm": ["fedavg", "dr"]}, [0], tmp_path, data=tiny, jobs=2)
    err = capsys.readouterr().err
    assert "2 runs at once, each in a process of its own with 1 torch thread(s)" in err, err
    for name in ("algorithm=fedavg__seed=0", "algorithm=dr__seed=0"):
        assert f"{name}: 0/2 rounds" in err and f"{name}: 2/2 rounds (100%)" in err, err  # its rounds, as it goes
        assert f"{name}: final accuracy" in err, err
    assert "sweep: 2/2 runs (100%)" in err, err


# The killed sweep: 2 × 2 runs of 30 rounds, a checkpoint every round, 2 at once.
KILLED_BASE = {**BASE, "rounds": 30}
KILLED_GRID = {"algorithm": ["fedavg", "dr"]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, synthetic):
    """The killed sweep's grid run serially in this process, on the dataset its processes load."""
    root = tmp_path_factory.mktemp("uninterrupted")
    sweep.run(KILLED_BASE, KILLED_GRID, [0, 1], root, progress=False)
    return _finished_runs(root)


def _live_processes(group: int) -> list[int]:
    """The processes of a process group that are still running (a zombie, which only waits to be reaped, is not)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] not in "ZX":
            live.append(int(stat.parent.name))
    return live


def _left_after(group: int, seconds: float) -> list[int]:
    """The processes of ``group`` still running ``seconds`` from now at the latest (none, as soon as all end).
    multiprocessing's resource tracker, in the sweep's group, exits only once it sees the sweep gone."""
    deadline = time.monotonic() + seconds
    while _live_processes(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _live_processes(group)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
@pytest.mark.parametrize("how", ["SIGINT to the sweep alone", "SIGINT to every process", "SIGKILL to every process"])
def test_an_interrupted_or_killed_jobs_sweep_stops_every_run_and_resumes_exactly(tmp_path, uninterrupted, how):
    """Ctrl-C in a notebook reaches the sweep alone, in a terminal every process; a kill -9 leaves no time to
    clean up. The interrupt is sent once two runs are under way (each has a checkpoint, neither a summary)."""
    root, grid = tmp_path / "root", _grid_file(tmp_path / "grid.json", KILLED_BASE, KILLED_GRID, seeds=[0, 1])
    cmd = [sys.executable, "-m", "feddr_kit", "sweep", "--grid", str(grid), "--root", str(root), "--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "FEDDR_PROGRESS": "lines"}
    # a process group of its own, as a terminal gives, with SIGINT at its default, as a terminal's foreground job
    # has it: a process inherits an ignored SIGINT, and Python then installs no KeyboardInterrupt for it, so a
    # test process that ignores it (as some in a whole-suite session did) would make the sweep deaf to Ctrl-C
    sweep_process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    under_way = []
    while len(under_way) < 2 and sweep_process.poll() is None:
        under_way = [p.parent for p in root.glob("*/checkpoint.pt") if not (p.parent / "summary.json").exists()]
        time.sleep(0.02)  # a look every round or so, leaving the cores to the runs
    signum = signal.SIGKILL if how.startswith("SIGKILL") else signal.SIGINT
    if how.endswith("alone"):
        os.kill(sweep_process.pid, signum)
    else:
        os.killpg(sweep_process.pid, signum)
    out, err = sweep_process.communicate(timeout=600)
    assert len(under_way) == 2, (out, err)
    assert not _left_after(sweep_process.pid, 10)  # every run's process stopped with the sweep
    if signum == signal.SIGINT:
        assert sweep_process.returncode == 130, err
        assert "interrupted: the last checkpoint is kept" in err and "Traceback" not in err, err
        assert not list(root.glob("**/.lock"))  # every folder released
        assert not any((folder / "summary.json").exists() for folder in under_way)  # stopped, not run to the end
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert ("taking over the lock" in again.stderr) == (signum == signal.SIGKILL), again.stderr
    assert all(f"{folder.name}: resumed" in again.stderr for folder in under_way), again.stderr
    _assert_same_runs(uninterrupted, _finished_runs(root))


# --------------------------------------------------------------------------- one grid per root
# The example of two grids that share a root: one varies the algorithm at lr 0.05, the other FedAvg's lr.
ALGORITHMS = (BASE, {"algorithm": ["fedavg", "dr"]})
FEDAVG_LRS = ({**BASE, "algorithm": "fedavg"}, {"lr": [0.05, 0.1]})


def test_a_root_refuses_a_second_grid_naming_both(tmp_path, tiny):
    sweep.run(*ALGORITHMS, [0], tmp_path, data=tiny, progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.*")}
    with pytest.raises(FeddrKitError) as err:
        sweep.run(*FEDAVG_LRS, [0], tmp_path, data=tiny, progress=False)
    message = str(err.value)
    assert 'grid {"algorithm": ["fedavg", "dr"]}' in message and 'grid {"lr": [0.05, 0.1]}' in message, message
    assert "vary different fields (algorithm there, lr here)" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["algorithm=dr__seed=0", "algorithm=fedavg__seed=0"]
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.*")} == before  # sweep.json, runs.csv, table.csv
    assert list(sweep.interval_summary(tmp_path)["n"]) == [1, 1]


def test_two_grids_started_at_once_one_is_refused_and_nothing_is_pooled(tmp_path):
    """Two command-line sweeps of the example's grids on one root at the same moment: whichever checks the
    root first runs, the other is refused, and the root's files hold the first one's grid only."""
    root = tmp_path / "root"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "feddr_kit", "sweep", "--grid", str(_grid_file(tmp_path / f"{i}.json", base, grid)),
                               "--root", str(root), "--no-progress", "--jobs", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, (base, grid) in enumerate((ALGORITHMS, FEDAVG_LRS))]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    assert "holds the runs of another grid" in outs[loser][1] and len(outs[loser][1].splitlines()) == 1, outs[loser]
    won = (ALGORITHMS, FEDAVG_LRS)[winner]
    assert json.loads((root / "sweep.json").read_text())["grid"] == won[1]
    runs = pd.read_csv(root / "runs.csv")
    assert len(runs) == 2 and set(runs[list(won[1])[0]]) == set(list(won[1].values())[0])
    assert list(pd.read_csv(root / "table.csv")["n"]) == [1, 1]


def test_a_sweep_of_the_same_fields_adds_values_and_seeds(tmp_path, tiny):
    sweep.run(BASE, {"algorithm": ["fedavg"]}, [0], tmp_path, data=tiny, progress=False)
    # another device or progress setting is bookkeeping: the same grid
    df = sweep.run({**BASE, "device": "cpu", "progress": False}, {"algorithm": ["dr", "fedavg"]}, [1, 0], tmp_path,
                   data=tiny, progress=False)
    assert list(df["name"]) == ["algorithm=dr__seed=1", "algorithm=fedavg__seed=1", "algorithm=dr__seed=0",
                                "algorithm=fedavg__seed=0"]
    assert json.loads((tmp_path / "sweep.json").read_text()) == {"base": {**BASE, "channels_last": None},
                                                                 "grid": {"algorithm": ["fedavg", "dr"]}, "seeds": [0, 1]}
    assert list(sweep.interval_summary(tmp_path)["n"]) == [2, 2]


def test_a_root_filled_with_two_grids_before_is_not_pooled(tmp_path, tiny):
    """A root that an older kit let two grids fill: the table names the field that differs instead of pooling."""
    sweep.run(*ALGORITHMS, [0], tmp_path, data=tiny, progress=False)
    other = tmp_path / "lr=0.1__seed=0"  # the second grid's FedAvg at lr 0.1, with the same seed
    shutil.copytree(tmp_path / "algorithm=fedavg__seed=0", other)
    point = json.loads((other / "point.json").read_text())
    (other / "point.json").write_text(json.dumps({**point, "config": {**point["config"], "lr": 0.1}}))
    with pytest.raises(FeddrKitError, match=r"grid point \{'algorithm': 'fedavg'\} .* holds 2 runs with seed 0, which "
                                            r"differ in lr .*more than one grid"):
        sweep.interval_summary(tmp_path)


# --------------------------------------------------------------------------- collect and table
def test_collect_reports_config_summary_and_timing(tmp_path, tiny):
    df = sweep.run(BASE, {"algorithm": ["fedavg", "dr"]}, [0, 1], tmp_path, data=tiny, progress=False)
    assert len(df) == 4 and set(df["status"]) == {"done"}
    assert list(df[["algorithm", "seed"]].itertuples(index=False, name=None)) == [
        ("fedavg", 0), ("dr", 0), ("fedavg", 1), ("dr", 1)]
    for _, row in df.iterrows():
        summary = json.loads((tmp_path / row["name"] / "summary.json").read_text())
        assert row["final_acc"] == summary["final_acc"] and row["sec_per_round"] == summary["sec_per_round"]
        assert row["total_seconds"] > 0 and row["num_clients"] == 10 and row["lr_decay_at"] == (0.5, 0.75)
    everything = sweep.collect(tmp_path)
    assert sorted(everything["name"]) == sorted(df["name"])
    table = sweep.table(df, rows="algorithm")
    assert list(table.index) == ["fedavg", "dr"] and table.columns.tolist() == ["final_acc"]
    assert table.loc["dr", "final_acc"].endswith("(n=2)")


def test_table_is_mean_and_sample_std_over_seeds():
    df = pd.DataFrame({
        "status": ["done"] * 7 + ["failed"],
        "algorithm": ["fedavg", "fedavg", "fedavg", "dr", "dr", "dr", "fedavg", "dr"],
        "shards_per_client": [2, 2, 5, 2, 2, 5, 5, 5],
        "seed": [0, 1, 0, 0, 1, 0, 1, 1],
        "final_acc": [0.40, 0.42, 0.50, 0.30, 0.36, 0.33, 0.54, 0.99],
    })
    t = sweep.table(df, rows="algorithm", cols="shards_per_client")
    assert list(t.index) == ["fedavg", "dr"] and list(t.columns) == [2, 5]
    assert t.loc["fedavg", 2] == "41.0 ± 1.4 (n=2)"   # std of (40, 42) = sqrt(2)
    assert t.loc["fedavg", 5] == "52.0 ± 2.8 (n=2)"   # std of (50, 54) = sqrt(8)
    assert t.loc["dr", 2] == "33.0 ± 4.2 (n=2)"       # std of (30, 36) = sqrt(18); the failed run is left out
    assert t.loc["dr", 5] == "33.0 (n=1)"
    raw = sweep.table(df, rows="algorithm", cols="shards_per_client", value="final_acc", percent=False,
                      fmt=".3f", show_n=False)
    assert raw.loc["fedavg", 2] == "0.410 ± 0.014"
    with pytest.raises(FeddrKitError, match="a field outside rows/cols varies"):
        sweep.table(df, rows="algorithm")
    with pytest.raises(FeddrKitError, match="no column"):
        sweep.table(df, rows="beta")


# --------------------------------------------------------------------------- command line
def test_cli_runs_a_grid_and_prints_the_table(tmp_path, capsys):
    """End to end in a fresh process, whose other hash seed must not change the folder names."""
    base, spec = {**BASE, "rounds": 1}, {"algorithm": ["fedavg", "dr"]}
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"base": base, "grid": spec, "seeds": [0]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "12345"}
    cmd = [sys.executable, "-m", "feddr_kit", "sweep", "--grid", str(grid), "--root", str(tmp_path / "runs"), "--no-progress",
           "--jobs", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("fedavg") and "(n=1)" in line for line in lines)
    assert any(line.startswith("dr") and "(n=1)" in line for line in lines)
    assert "2 of 2 runs done" in out.stdout
    names_here = {sweep.run_dir_name(c, base, spec) for c in sweep.expand(base, spec, [0])}
    assert names_here == {"algorithm=fedavg__seed=0", "algorithm=dr__seed=0"}
    assert {p.name for p in (tmp_path / "runs").iterdir()} == names_here | {"sweep.json", "runs.csv", "table.csv"}
    from feddr_kit.__main__ import main

    grid.write_text("{not json")
    assert main(cmd[3:]) == 2  # the same command line, in this process
    err = capsys.readouterr().err
    assert err.startswith("error: --grid: cannot read") and len(err.splitlines()) == 1


# --------------------------------------------------------------------------- papermill
def _throwaway_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 1\nseed = 0\nout_dir = None")
    params.metadata["tags"] = ["parameters"]
    work = nbformat.v4.new_code_cell(
        "import json, pathlib\n"
        "assert x >= 0, 'x must be >= 0'\n"
        "pathlib.Path(out_dir, 'results.json').write_text(json.dumps({'x2': 2 * x, 'seed': seed, 'nested': {'x': x}}))")
    nb.cells = [params, work]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_notebook_grid_runs_each_point_once_and_collects_results(tmp_path):
    notebook = _throwaway_notebook(tmp_path / "tiny.ipynb")
    root = tmp_path / "grid"
    df = sweep.run_notebook_grid(notebook, {"x": [1, 3, -1]}, [7], root, progress=False)
    assert list(df["name"]) == ["x=1__seed=7", "x=3__seed=7", "x=-1__seed=7"]
    assert list(df["status"]) == ["done", "done", "failed"]
    assert list(df["x2"][:2]) == [2, 6] and list(df["nested.x"][:2]) == [1, 3] and set(df["seed"]) == {7}
    assert "x must be >= 0" in df.loc[2, "error"]
    assert (root / "x=1__seed=7" / "notebook.ipynb").exists()
    stamp = (root / "x=1__seed=7" / "results.json").stat().st_mtime_ns
    again = sweep.run_notebook_grid(notebook, {"x": [1, 3, -1]}, [7], root, progress=False)  # nothing re-executed
    assert (root / "x=1__seed=7" / "results.json").stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(df, again)
    collected = sweep.collect_notebooks(root)  # folder order; same rows
    pd.testing.assert_frame_equal(collected.set_index("name").loc[df["name"]].reset_index(), df)


# --------------------------------------------------------------------------- histories, results CSVs, intervals
def test_histories_stacks_every_finished_run_and_leaves_out_the_rest(tmp_path, tiny):
    sweep.run(BASE, {"algorithm": ["fedavg", "dr"]}, [0], tmp_path, data=tiny, progress=False)
    # a third folder, interrupted: its history.csv exists but the run has no summary.json
    partial = tmp_path / "algorithm=feddr+__seed=0"
    partial.mkdir()
    (tmp_path / "algorithm=dr__seed=0" / "history.csv").replace(partial / "history.csv")
    (tmp_path / "algorithm=dr__seed=0" / "summary.json").replace(partial / "point.json")  # any started-run marker
    h = sweep.histories(tmp_path)
    assert list(h.columns[:2]) == ["name", "round"]
    assert list(h["name"]) == ["algorithm=fedavg__seed=0"] * 2  # dr lost its summary, feddr+ never had one
    alone = pd.read_csv(tmp_path / "algorithm=fedavg__seed=0" / "history.csv")
    pd.testing.assert_frame_equal(h.drop(columns="name"), alone)
    assert list(h["round"]) == [1, 2]  # BASE: 2 rounds, evaluated every round
    assert sweep.histories(tmp_path / "algorithm=fedavg__seed=0").empty  # a run folder has no run folders
    with pytest.raises(FeddrKitError, match="root must be an existing folder"):
        sweep.histories(tmp_path / "nowhere")


def test_read_results_fills_grid_fields_from_the_run_names(tmp_path):
    csv = tmp_path / "ch.csv"
    pd.DataFrame({"setting": ["s=2", "s=2"], "seed": [0, 1], "final_acc": [0.3, 0.4],
                  "name": ["algorithm=feddr+__beta=0.5__seed=0", "algorithm=feddr+__beta=0.5__seed=1"]}).to_csv(csv, index=False)
    df = sweep.read_results(csv, ["algorithm", "beta", "seed"])
    assert list(df["algorithm"]) == ["feddr+", "feddr+"] and list(df["beta"]) == [0.5, 0.5]
    assert sweep.fields_from_name("lr=1e-05__seed=0__0123456789") == {"lr": 1e-05, "seed": 0}
    with pytest.raises(FeddrKitError, match="'regularizer' is neither a column"):
        sweep.read_results(csv, ["regularizer"])
    with pytest.raises(FeddrKitError, match="existing results CSV"):
        sweep.read_results(tmp_path / "missing.csv")
    empty = sweep.read_results(tmp_path / "missing.csv", ["algorithm", "seed"], missing_ok=True)  # not collected yet
    assert empty.empty and {"algorithm", "seed", "setting", "final_acc", "name"} <= set(empty.columns)


def test_interval_table_and_paired_difference_are_t_intervals_over_seeds():
    df = pd.DataFrame({
        "algorithm": ["a", "a", "a", "b", "b", "b", "a", "b"],
        "setting": ["x"] * 6 + ["y", "y"],
        "seed": [0, 1, 2, 2, 0, 1, 0, 5],
        "final_acc": [0.40, 0.42, 0.44, 0.37, 0.30, 0.32, 0.5, 0.6],
    })
    t2 = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2), from a table: 4.303
    iv = sweep.intervals(df, ["algorithm", "setting"]).set_index(["algorithm", "setting"])
    assert iv.loc[("a", "x"), "mean"] == pytest.approx(0.42)
    assert iv.loc[("a", "x"), "half_width"] == pytest.approx(t2 * 0.02 / 3 ** 0.5)  # sd of (40, 42, 44)% is 2%
    assert iv.loc[("a", "y"), "n"] == 1 and iv.loc[("a", "y"), "half_width"] == float("inf")
    table = sweep.interval_table(df, "algorithm", "setting", columns=["x", "y", "z"], index=["a", "b", "c"])
    assert table.loc["a", "x"] == "42.0 ± 5.0 (n=3)"   # 4.303 * 2 / sqrt(3) = 4.97
    assert table.loc["a", "y"] == "50.0 (n=1)" and table.loc["a", "z"] == "—" and (table.loc["c"] == "—").all()
    # paired by seed, whatever the row order: differences a - b = (0.10, 0.10, 0.07) for seeds 0, 1, 2
    d = sweep.paired_difference(df, {"algorithm": "a", "setting": "x"}, {"algorithm": "b", "setting": "x"})
    assert d.n == 3 and d.mean == pytest.approx(0.09)
    assert d.half_width == pytest.approx(t2 * 0.017320508 / 3 ** 0.5, rel=1e-6)  # sd of (10, 10, 7)% is sqrt(3)%
    # setting y: a has seed 0, b seed 5 -> nothing to pair
    nothing = sweep.paired_difference(df, {"algorithm": "a", "setting": "y"}, {"algorithm": "b", "setting": "y"})
    assert nothing.n == 0 and not nothing.testable and fk.stats.verdict(nothing) == fk.stats.UNTESTABLE
    with pytest.raises(FeddrKitError, match="repeated seeds"):
        sweep.seed_values(df, {"algorithm": "a"})


def test_baseline_columns_say_whether_a_baseline_learned():
    df = pd.DataFrame({"algorithm": ["a"] * 3 + ["b"] * 3 + ["c"], "seed": [0, 1, 2, 0, 1, 2, 0],
                       "final_acc": [0.40, 0.42, 0.44, 0.10, 0.13, 0.16, 0.5]})
    out = sweep.baseline_columns(df, [("a", {"algorithm": "a"}), ("b here", {"algorithm": "b"}),
                                      ("c", {"algorithm": "c"}), ("d", {"algorithm": "d"})], chance=0.1, band=0.02)
    assert list(out.columns) == ["baseline final acc (95 % interval)", "baseline above chance?"]
    # a: 42 ± 4.97 (t2 · 2 / √3); b: 13 ± 7.45, whose low end (5.5 %) is below chance + band
    assert out.iloc[0].tolist() == ["a 42.0 [37.0, 47.0] %", "yes"]
    assert out.iloc[1].tolist() == ["b here 13.0 [5.5, 20.5] %", "no: reaches chance"]
    assert out.iloc[2].tolist() == ["c 50.0 % (n=1)", "no: reaches chance"]  # one seed shows nothing
    assert out.iloc[3].tolist() == ["—", "no run"]
    # the band decides: a's low end (37.0 %) against chance 0.3 with and without a 0.1 band
    assert sweep.baseline_columns(df, [("a", {"algorithm": "a"})], chance=0.3).iloc[0, 1] == "yes"
    assert sweep.baseline_columns(df, [("a", {"algorithm": "a"})], chance=0.3, band=0.1).iloc[0, 1] == "no: reaches chance"


PAPER_TEX = REPO.parent / "shared" / "paper" / "feddr-plus-paper.tex"


@pytest.mark.skipif(not PAPER_TEX.is_file(), reason="the paper's LaTeX source is not beside the repository")
def test_paper_numbers_match_the_latex_source():
    """Every number of fk.paper against the rows of the paper's LaTeX tables (read here independently)."""
    import math
    import re

    from feddr_kit import paper

    tex = PAPER_TEX.read_text()
    names = {"FedAvg": "fedavg", "SCAFFOLD": "scaffold", "FedNTD": "fedntd", "FedExP": "fedexp",
             "FedBABU": "fedbabu", "SphereFed": "spherefed", "FedETF": "fedetf", "\\alg": "feddr+",
             "Dot-Regression": "dr"}
    cell = re.compile(r"(\d+\.\d+)\}*\{\\tiny \$\\pm\$ ?(\d+\.\d+)\}|\\textit\{\(Failed\)\}")

    def rows(block: str, width: int) -> dict[str, list]:
        out = {}
        for line in re.sub(r"\n\s*&", " &", block).splitlines():  # a row may wrap before its first &
            label = line.strip().split("~")[0].split(" ")[0]
            if label in names and "&" in line:
                cells = [(float(m[1]), float(m[2])) if m[1] else (math.nan, math.nan) for m in cell.finditer(line)]
                if not cells:
                    cells = [float(x) for x in re.findall(r"(?<![\d.])(\d+\.\d+)", line.split("&", 1)[1])]
                assert len(cells) == width, line
                out[names[label]] = cells
        return out

    t3 = tex[tex.index("\\label{tab:gfl_acc_all}"):]
    shard, lda = t3[:t3.index("Partition Strategy: LDA")], t3[t3.index("Partition Strategy: LDA"):t3.index("\\end{tabular}")]
    want3 = paper.table3()
    for block, cols in ((shard, ["s=2", "s=5", "s=10"]), (lda, ["α=0.1", "α=0.2", "α=0.3"])):
        got = rows(block, 7)
        assert set(got) == set(want3.index.get_level_values(0))
        for algo, cells in got.items():
            for (mean, std), col in zip(cells[4:], cols):  # the last three: VGG on CIFAR-10
                assert want3.loc[(algo, "mean"), col] == pytest.approx(mean, nan_ok=True), (algo, col)
                assert want3.loc[(algo, "std"), col] == pytest.approx(std, nan_ok=True), (algo, col)
    t1 = tex[tex.index("\\label{tab:synergy_effect}"):]
    got1 = rows(t1[:t1.index("\\end{tabular}")], 12)
    for algo, numbers in got1.items():
        assert list(paper.table1("s=10").loc[algo]) == numbers[:6], algo
        assert list(paper.table1("α=0.1").loc[algo]) == numbers[6:], algo
    assert set(got1) == set(paper.table1().index)
    t7 = tex[tex.index("\\label{apptab:elapsed_time}"):]
    header = re.search(r"& FedAvg & (.*?)\\\\", t7)[0]
    order = [names.get(h.strip().split(" ")[0], h.strip()) for h in header.strip("&\\ ").split("&")]
    times = [float(x) for x in re.findall(r"(\d+\.\d+)", re.search(r"Elapsed time(.*?)\\\\", t7)[1])]
    assert dict(zip(order, times)) == paper.table7().to_dict()
