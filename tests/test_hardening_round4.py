"""The paper-scale recipe's edges, Flower's deployment path, config files and the repository finder, each
cause with the test that reproduces it; then behaviours that no other test pinned; then the guard that ends a
test's child processes however the test ends (:func:`guard`, :func:`end_tree`), used by the tests that start
papermill or Flower's servers.

Fast: synthetic data, tiny configs, and mocks where the real thing would time a VGG-11 round or start Flower.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest

import feddr_kit as fk
from feddr_kit import repo
from feddr_kit.__main__ import build_parser, command_config
from feddr_kit.__main__ import main as kit_main
from feddr_kit.config import read_mapping
from feddr_kit.errors import FeddrKitError
from feddr_kit.flower import launch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "results"))
import paper_scale  # noqa: E402


# --------------------------------------------------------------------------- processes that end with the test
# Run by a watchdog process (argv: this process's pid, the root's pid) or at once (argv: "now", the root's pid):
# SIGKILL to the root's session and to every process under it by parent pid. The parent pid reaches a process
# that left the session (Jupyter starts its kernel in a session of its own, Flower's SuperLink its SuperExec).
WATCHDOG = r'''
import os, signal, sys, time

def tree(root):
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            procs[int(entry)] = (int(fields[1]), int(fields[3]))  # parent pid, session
    found = {pid for pid, (_, sid) in procs.items() if sid == root}
    while True:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in found} - found
        if not more:
            return found - {os.getpid()}
        found |= more

def kill(root):
    for _ in range(3):  # again, for what was being started during the pass before
        for pid in tree(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)

parent, root = sys.argv[1], int(sys.argv[2])
if parent != "now":
    while os.getppid() == int(parent):  # a child whose parent dies gets another parent
        time.sleep(0.5)
kill(root)
'''


def guard(proc: subprocess.Popen) -> subprocess.Popen:
    """A watchdog that kills ``proc`` (started with ``start_new_session=True``) and every process under it once
    this process is gone, however it went: a CI job killed at its time limit (SIGTERM or SIGKILL to pytest) runs
    no ``finally``, and a child in a session of its own is out of reach of a kill of pytest's process group.
    Stop it with :func:`end_tree`."""
    return subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(proc.pid)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def end_tree(proc: subprocess.Popen, watchdog: subprocess.Popen | None = None) -> None:
    """Kill what is left of ``proc``'s tree now (after the test, a timeout or a failure alike: nothing outlives
    the test), reap ``proc`` and stop its ``watchdog``."""
    subprocess.run([sys.executable, "-c", WATCHDOG, "now", str(proc.pid)], timeout=60, check=False)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    if watchdog is not None:
        watchdog.kill()
        watchdog.wait()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def under(root: int) -> set[int]:
    """``root`` and the processes under it by parent pid, now."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found = {root}
    while more := {pid for pid, ppid in parents.items() if ppid in found} - found:
        found |= more
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_guarded_process_tree_ends_when_the_test_process_is_killed(how):
    """A test process starts a tree (a child, in a session of its own, with a grandchild that leaves the session
    as Jupyter's kernel does) under :func:`guard`, and is killed as CI kills at its limit: the tree goes too."""
    code = ("import os, subprocess, sys, time\n" f"WATCHDOG = {WATCHDOG!r}\n" + inspect.getsource(guard) +
            "proc = subprocess.Popen(['bash', '-c', 'sleep 300 & setsid sleep 300 & wait'], start_new_session=True)\n"
            "guard(proc)\nprint(proc.pid, flush=True)\ntime.sleep(300)\n")
    test = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    tree: set[int] = set()
    try:
        root = int(test.stdout.readline())
        for _ in range(100):  # both sleeps started
            tree = under(root)
            if len(tree) >= 3:
                break
            time.sleep(0.1)
        assert len(tree) >= 3, tree
        test.send_signal(how)
        test.wait(30)
        for _ in range(100):
            if not any(alive(pid) for pid in tree):
                break
            time.sleep(0.2)
        assert not [pid for pid in tree if alive(pid)], "the tree outlived the killed test process"
    finally:
        for pid in tree | {test.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        test.wait(30)


# --------------------------------------------------------------------------- the paper-scale recipe
def run_cli(capsys, *argv: str) -> tuple[int, list[str]]:
    """``paper_scale.cli(argv)``: the exit code and the lines it wrote to stderr (no traceback among them)."""
    try:
        code = paper_scale.cli(list(argv))
    except KeyboardInterrupt:  # would stop the whole test session, not fail this test
        pytest.fail("Ctrl-C went through paper_scale.cli")
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err.strip().splitlines()


def fake_run(folder: Path, best_acc: float, local_accs: list[float], final_acc: float = 0.5) -> Path:
    """A finished run's summary.json and history.csv (what the recipe's table reads) in ``folder``."""
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"lr0": 0.1, "best_acc": best_acc, "final_acc": final_acc,
                                                     "sec_per_round": 1.0, "rounds": 2}))
    pd.DataFrame({"round": range(1, len(local_accs) + 1), "test_acc": best_acc,
                  "local_test_acc": local_accs}).to_csv(folder / "history.csv", index=False)
    return folder


def run_folder(root: Path, group: int, seed: int = 0, cell: int = 0, scale: dict = paper_scale.TINY_SCALE) -> Path:
    """Where the plan at ``scale`` (default: the tiny one) puts ``group``'s ``cell`` at ``seed`` under ``root``."""
    g = paper_scale.groups(scale)[group]
    return g.folders(root, scale, seed)[cell][2]


@pytest.fixture
def no_data(monkeypatch):
    """The recipe's data loading as a no-op (the tests below plan, time and run with mocks)."""
    monkeypatch.setattr(paper_scale.fk.data, "load", lambda name: None)


@pytest.mark.parametrize("budget", ["nan", "NaN"])
def test_a_nan_budget_is_refused_in_one_line(tmp_path, capsys, monkeypatch, budget):
    monkeypatch.setattr(paper_scale.fk.data, "load", lambda name: pytest.fail("nothing may load"))
    code, lines = run_cli(capsys, "--tiny", "--root", str(tmp_path / "runs"), "--budget", budget, "--sec-per-round", "1")
    assert code == 2 and len(lines) == 1 and "--budget" in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_exits_130_with_one_line(tmp_path, capsys, monkeypatch, no_data):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(paper_scale, "run_plan", interrupted)
    code, lines = run_cli(capsys, "--tiny", "--root", str(tmp_path / "runs"), "--seeds", "0", "--sec-per-round", "1",
                          "--budget", "1000")
    assert code == 130 and len(lines) == 1 and lines[0].startswith("interrupted:"), lines


def test_collect_only_with_a_torn_summary_is_one_line_naming_it(tmp_path, capsys):
    root = tmp_path / "runs"
    fake_run(run_folder(root, 0, cell=0), 0.4, [0.5, 0.6])
    torn = fake_run(run_folder(root, 0, cell=1), 0.4, [0.5, 0.6]) / "summary.json"
    torn.write_text(torn.read_text()[:25])  # cut, as a copy cut short leaves it
    code, lines = run_cli(capsys, "--tiny", "--root", str(root), "--collect-only")
    assert code == 2 and len(lines) == 1 and str(torn) in lines[0], lines


def test_collect_only_of_another_root_writes_its_page_there_not_the_repositorys(tmp_path, monkeypatch, capsys):
    repo_page = tmp_path / "repository" / "docs" / "paper_scale.md"
    monkeypatch.setattr(paper_scale, "DOC", repo_page)  # stands for docs/paper_scale.md, not to be written
    elsewhere = tmp_path / "elsewhere"
    fake_run(run_folder(elsewhere, 0, scale=paper_scale.PAPER_SCALE), 0.4, [0.5, 0.6])
    assert paper_scale.main(["--root", str(elsewhere), "--seeds", "0", "--collect-only"]) == []
    assert not repo_page.exists()
    assert (elsewhere / "paper_scale.md").is_file() and (elsewhere / "paper_scale.csv").is_file()
    default = paper_scale.parse_args([])
    assert paper_scale.doc_path(default, paper_scale.ROOT) == repo_page  # the repository's runs: its page
    code, lines = run_cli(capsys, "--root", str(tmp_path / "missing"), "--collect-only")
    assert code == 2 and len(lines) == 1 and "missing" in lines[0]


def test_without_a_timing_it_says_so_and_stops_timing_when_the_budget_is_spent(tmp_path, monkeypatch, capsys, no_data):
    monkeypatch.setattr(paper_scale, "measured_seconds", lambda *args: {})  # no CSV for this machine

    def slow_run(cfg, data=None):  # a round far slower than the budget
        for _ in range(200):
            time.sleep(0.05)
        pytest.fail("the timing went on past the budget")

    monkeypatch.setattr(paper_scale.fk, "run", slow_run)
    started = paper_scale.main(["--tiny", "--root", str(tmp_path / "runs"), "--budget", "0.5"])
    out = capsys.readouterr().out
    assert started == [] and not (tmp_path / "runs").exists()
    assert "timing 3 FedDr+ rounds first, out of the budget" in out and "budget ran out while timing" in out


def test_deadline_interrupts_the_block_and_disarms_after_it():
    with pytest.raises(paper_scale.OutOfBudget):
        with paper_scale.deadline(0.05):
            for _ in range(200):
                time.sleep(0.05)
    with paper_scale.deadline(10.0):
        pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with paper_scale.deadline(math.inf):  # no budget: no timer
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_budget_pays_for_the_data_and_the_timing_round_before_runs_are_chosen(tmp_path, monkeypatch, capsys):
    """A fake clock: loading takes 100 s and the timing 50 s of a 200 s budget, so 50 s are left to plan with: one
    unit of two tiny runs (2 rounds × 10 s × 1.1 each), where the whole 200 s would hold four units."""
    clock = [0.0]
    monkeypatch.setattr(paper_scale, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def load(name):
        clock[0] += 100.0

    limits = []

    def timed(cfg, data, limit_s=math.inf):
        limits.append(limit_s)
        clock[0] += 50.0
        return 10.0

    ran = []
    monkeypatch.setattr(paper_scale.fk.data, "load", load)
    monkeypatch.setattr(paper_scale, "measured_seconds", lambda *args: {})
    monkeypatch.setattr(paper_scale, "timed_round", timed)
    monkeypatch.setattr(paper_scale, "run_plan", lambda units, *args: ran.extend(units))
    chosen = paper_scale.main(["--tiny", "--root", str(tmp_path / "runs"), "--seeds", "0", "--budget", "200"])
    assert [(u.group, u.seed) for u in chosen] == [(0, 0)] and ran == chosen
    assert limits == [100.0]  # the timing may use only what the loading left
    assert "of 50 s" in capsys.readouterr().out


def test_reported_is_the_best_local_test_accuracy_on_shards_and_the_best_test_accuracy_at_alpha(tmp_path):
    root = tmp_path / "runs"
    shard = fake_run(run_folder(root, 0), best_acc=0.6, local_accs=[0.3, 0.7, 0.5], final_acc=0.55)
    dirichlet = fake_run(run_folder(root, 4), best_acc=0.6, local_accs=[0.3, 0.7, 0.5], final_acc=0.55)
    rows = paper_scale.rows(root, paper_scale.TINY_SCALE, [0]).set_index("run")
    at = {folder: rows.loc[folder.relative_to(root).as_posix()] for folder in (shard, dirichlet)}
    assert (at[shard]["setting"], at[dirichlet]["setting"]) == ("s=2", "α=0.1")
    assert at[shard]["reported"] == 0.7 and at[shard]["best_local_acc"] == 0.7  # the clients' local-test mean
    assert at[dirichlet]["reported"] == 0.6 and at[dirichlet]["best_acc"] == 0.6  # the test set


# --------------------------------------------------------------------------- Flower's deployment path
FLOWER_RUN = ["flower", "--federation", "deployment", "--dataset", "synthetic", "--num-clients", "2",
              "--clients-per-round", "2", "--rounds", "1"]


@pytest.mark.parametrize("address", ["http://127.0.0.1:9093", "https://superlink:9093", "bad host:9093",
                                     "127.0.0.1/x:9093", "[not-ipv6]:9093"])
def test_a_superlink_address_flwr_cannot_use_is_refused_at_once(tmp_path, capsys, monkeypatch, address):
    monkeypatch.setattr(launch, "wait_healthy", lambda *a, **k: pytest.fail("it waited for the SuperLink"))
    assert kit_main([*FLOWER_RUN, "--superlink", address, "--out-dir", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HOST:PORT" in err and "Traceback" not in err, err
    if "://" in address:  # the line says what to leave out
        assert f"leave out {address.split('://')[0]}://" in err, err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:9093", "localhost:9093", "[::1]:9093", "superlink.example.org:443"])
def test_a_host_name_or_ip_address_and_a_port_pass(address):
    assert launch.check_superlink(address) == address


def test_flwr_missing_beside_this_python_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    pytest.importorskip("flwr")  # else the line says Flower is not installed at all
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(launch, "wait_healthy", lambda *a, **k: None)  # past the check, flwr run would start
    assert kit_main([*FLOWER_RUN, "--superlink", "127.0.0.1:9093", "--out-dir", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "`flwr`" in err and str(tmp_path / "bin" / "flwr") in err and 'pip install -e ".[flower]"' in err
    with pytest.raises(FeddrKitError, match="flower-superlink"):  # the simulation's SuperLink, by its path
        launch.command("flower-superlink")


def test_an_overwriting_flower_run_starts_from_a_folder_emptied_of_the_old_results(tmp_path, monkeypatch):
    """A crash of the new run (``flwr run --stream`` exits 0 all the same) must not pass the old run's files off
    as its own: the folder is emptied before ``flwr run`` starts, so the check finds nothing and says so."""
    pytest.importorskip("flwr")
    pytest.importorskip("tomli_w")
    cfg = fk.Config(dataset="synthetic", num_clients=2, clients_per_round=2, rounds=2, out_dir=str(tmp_path / "run"),
                    overwrite=True, progress=False)
    folder = Path(cfg.out_dir)
    folder.mkdir()
    old = {"config.json": cfg.to_json(), "history.csv": "round,test_acc\n2,0.5\n",
           "summary.json": json.dumps({"rounds": 2, "final_acc": 0.5}), "checkpoint.pt": "x",
           launch.TIMING: json.dumps({"first_round_start": 0.0})}
    for name, text in old.items():
        (folder / name).write_text(text)
    seen = []
    monkeypatch.setattr(launch, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(launch, "_flwr_run", lambda *a, **k: seen.append(sorted(p.name for p in folder.iterdir())))
    with pytest.raises(FeddrKitError, match="left no config.json, history.csv, summary.json, checkpoint.pt"):
        launch.deploy(cfg, "127.0.0.1:9093")
    assert seen and not set(old) & set(seen[0]), seen  # what flwr run started from
    assert not set(old) & {p.name for p in folder.iterdir()}


# --------------------------------------------------------------------------- config files, the repository
def config_from(tmp_path: Path, text: str, name: str = "run.yaml") -> fk.Config:
    file = tmp_path / name
    file.write_text(text)
    return command_config(vars(build_parser(typed_only=True).parse_args(["run", "--config", str(file)])), str(file))


@pytest.mark.parametrize("text, name", [("rounds: 1.0\n", "run.yaml"), ("rounds: '1.0'\n", "run.yaml"),
                                        ("rounds: 1.0e0\n", "run.yaml"), ('{"rounds": 1.0}', "run.json"),
                                        ('{"rounds": "1.0"}', "run.json")])
def test_a_whole_number_is_the_integer_however_a_config_file_writes_it(tmp_path, text, name):
    cfg = config_from(tmp_path, text, name)
    assert cfg.rounds == 1 and type(cfg.rounds) is int


@pytest.mark.parametrize("flag", ["1.0", "1e0", "1"])
def test_a_whole_number_is_the_integer_however_a_flag_writes_it(flag):
    """The flags read an int field as a config file does: ``--rounds 1.0`` is ``rounds: 1.0``."""
    args = vars(build_parser(typed_only=True).parse_args(["run", "--rounds", flag, "--partition-seed", flag]))
    assert args["rounds"] == args["partition_seed"] == 1 and type(args["rounds"]) is int


def test_a_fraction_for_an_integer_flag_is_one_line_naming_it(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["run", "--rounds", "2.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].endswith("argument --rounds: expected a whole number, got '2.5'"), err


@pytest.mark.parametrize("text", ["rounds: 2.5\n", "rounds: '2.5'\n", "seed: .inf\n", "seed: .nan\n"])
def test_a_fraction_for_an_integer_field_is_refused_however_written(tmp_path, text):
    with pytest.raises(FeddrKitError, match=r"^(rounds|seed) must be an integer"):
        config_from(tmp_path, text)


@pytest.mark.parametrize("text, name", [("lr: 0.1\nrounds: 2\nlr: 0.2\n", "run.yaml"),
                                        ('{"lr": 0.1, "rounds": 2, "lr": 0.2}', "run.json")])
def test_a_key_given_twice_is_refused_naming_it(tmp_path, capsys, text, name):
    (tmp_path / name).write_text(text)
    with pytest.raises(FeddrKitError, match=f"{name} gives 'lr' twice"):
        fk.Config.from_file(tmp_path / name)
    assert kit_main(["run", "--config", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'lr' twice" in err, err


def test_a_key_given_twice_in_a_nested_mapping_is_refused_but_a_yaml_merge_may_override(tmp_path):
    (tmp_path / "grid.yaml").write_text("base: {rounds: 2}\ngrid:\n  lr: [0.1]\n  lr: [0.2]\nseeds: [0]\n")
    with pytest.raises(FeddrKitError, match="'lr' twice"):
        read_mapping(tmp_path / "grid.yaml", "--grid")
    (tmp_path / "merge.yaml").write_text("common: &c {lr: 0.1, rounds: 2}\nrun:\n  <<: *c\n  lr: 0.2\n")
    assert read_mapping(tmp_path / "merge.yaml")["run"] == {"lr": 0.2, "rounds": 2}


@pytest.fixture
def gone_cwd(tmp_path, monkeypatch):
    """The working directory, deleted under this process (a notebook whose folder was removed)."""
    folder = tmp_path / "gone"
    folder.mkdir()
    monkeypatch.chdir(folder)
    folder.rmdir()


def test_results_with_a_deleted_working_directory_is_the_installed_copys(gone_cwd):
    if not repo.is_repo(repo.PACKAGE_REPO):
        pytest.skip("feddr_kit is installed without its repository here")
    assert repo.results() == repo.PACKAGE_REPO / "results"
    assert repo.root("relative/start") == repo.PACKAGE_REPO


def test_a_deleted_working_directory_without_an_installed_repository_is_one_line(gone_cwd, tmp_path):
    with pytest.raises(FeddrKitError, match="the working directory, which was deleted"):
        repo.root(installed=tmp_path / "not-a-repo")


# --------------------------------------------------------------------------- behaviours no test pinned
def _saved_without(tmp_path, cfg, field: str):
    """``(file name, folder)`` of a run folder holding ``cfg`` without ``field``, once as a sweep's point.json and
    once as a run's config.json: a record written before ``field`` existed or changed its default."""
    old = {k: v for k, v in cfg.to_dict().items() if k != field}
    for name, saved in (("point.json", {"config": old}), ("config.json", old)):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_text(json.dumps(saved))
        yield name, folder


def test_a_saved_point_or_config_without_a_later_field_is_compared_at_its_default(tmp_path):
    """A run folder written before ``tf32`` existed holds the run at tf32's default (True): the same run as
    ``Config(tf32=True)``, another than ``Config(tf32=False)``."""
    from feddr_kit.sweep.root import mismatch

    cfg = fk.Config(dataset="synthetic", rounds=2)
    for name, folder in _saved_without(tmp_path, cfg, "tf32"):
        assert mismatch(folder, cfg) is None, name
        assert "tf32" in mismatch(folder, cfg.replace(tf32=False)), name


def test_a_saved_record_without_channels_last_holds_nchw_runs(tmp_path):
    """``channels_last``'s default became None (auto) after runs were recorded with False: a point.json, config.json
    or sweep.json base that leaves it out holds NCHW runs, the same as ``channels_last=False`` and another than
    True or (in a sweep's own records) auto. A sweep now writes the field out when its base leaves it at auto."""
    from feddr_kit.sweep.grid import recorded_base
    from feddr_kit.sweep.root import mismatch, other_grid

    cfg = fk.Config(dataset="synthetic", rounds=2, channels_last=False)
    for name, folder in _saved_without(tmp_path, cfg, "channels_last"):
        assert mismatch(folder, cfg) is None, name
        assert "channels_last=False there" in mismatch(folder, cfg.replace(channels_last=True)), name
    assert "channels_last=False there" in mismatch(tmp_path / "point", cfg.replace(channels_last=None))
    assert mismatch(tmp_path / "config", cfg.replace(channels_last=None)) is None  # a run's config: None matches its bool
    before = {"base": {"dataset": "synthetic"}, "grid": {"algorithm": ["fedavg"]}, "seeds": [0]}
    pinned = {**before, "base": {"dataset": "synthetic", "channels_last": False}}
    auto = {**before, "base": recorded_base({"dataset": "synthetic"})}
    assert auto["base"] == {"dataset": "synthetic", "channels_last": None}
    assert other_grid(before, pinned) is None
    assert "channels_last=False there but channels_last=None here" in other_grid(before, auto)
    assert other_grid(auto, auto) is None


@pytest.mark.parametrize("start", ["notebooks", "notebooks/../results", "."])
def test_root_and_results_are_absolute_from_a_relative_start(tmp_path, monkeypatch, start):
    clone = tmp_path / "clone"
    (clone / "feddr_kit").mkdir(parents=True)
    (clone / "feddr_kit" / "__init__.py").write_text("")
    (clone / "results").mkdir()
    (clone / "notebooks").mkdir()
    (clone / "pyproject.toml").write_text("")
    monkeypatch.chdir(clone)
    found, results = repo.root(start, installed="/nonexistent"), repo.results(start)
    assert found.is_absolute() and found == clone
    assert results.is_absolute() and results == clone / "results"


@pytest.mark.parametrize("text", ["3", "null", "[1, 2]", '"config"'])
def test_a_saved_config_that_is_not_a_json_object_is_one_line_naming_the_file(tmp_path, capsys, text):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(text)
    (run / "checkpoint.pt").write_text("x")
    commands = {"resume": ["run", "--out-dir", str(run), "--resume"],
                "export": ["export", str(run), "--to", str(tmp_path / "out" / "model.pt")],
                "finetune": ["personalize", "--run", str(run), "--out", str(tmp_path / "p1")],
                "local-only": ["personalize", "--run", str(run), "--method", "local-only", "--out", str(tmp_path / "p2")]}
    for what, argv in commands.items():
        assert kit_main(argv) == 2, what
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(run / "config.json") in err and "Traceback" not in err, (what, err)
    info = {"format": fk.export.FORMAT, "weights": "model.pt", "config": json.loads(text), "num_classes": 10,
            "image_shape": [3, 32, 32]}
    (tmp_path / "model.json").write_text(json.dumps(info))
    (tmp_path / "model.pt").write_text("x")
    with pytest.raises(FeddrKitError, match=re.escape(f"{tmp_path / 'model.json'} holds no config")):
        fk.load_model(tmp_path / "model.pt")


def test_interval_table_shows_plus_minus_for_a_cell_of_two_seeds():
    df = pd.DataFrame({"algorithm": ["a", "a", "b"], "setting": ["x", "x", "x"], "seed": [0, 1, 0],
                       "final_acc": [0.40, 0.44, 0.5]})
    table = fk.sweep.interval_table(df, "algorithm", "setting")
    half = 12.706204736174707 * 0.02 * 100  # t(0.975, 1) × sd/√2 (sd = 0.02·√2), in points: 25.4
    assert table.loc["a", "x"] == f"42.0 ± {half:.1f} (n=2)"
    assert table.loc["b", "x"] == "50.0 (n=1)"


def test_digest_lists_ties_against_the_claim_before_ties_in_its_direction():
    from feddr_kit.stats import TIE, TIE_AGAINST, TIE_TOWARD, Claim, claims_table, digest, interval

    rows = [Claim("plain tie", "paper", "s", interval([-1.0, 2.0, 3.0]), "greater", 0.1),
            Claim("small gain", "paper", "s", interval([0.30, 0.31, 0.32]), "greater", 0.5),
            Claim("small loss", "paper", "s", interval([-0.30, -0.31, -0.32]), "greater", 0.5)]
    table = claims_table(rows)
    assert list(table["verdict"]) == [TIE, TIE_TOWARD, TIE_AGAINST]
    heads = [line.split("**")[1] for line in digest(table).splitlines() if line.startswith("* ")]
    assert heads == [TIE_AGAINST, TIE_TOWARD, TIE]
