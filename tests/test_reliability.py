"""Issue 10: runs that never lose or mix results, and a clean one-line error on every bad path.

Items 1-3 and 6-8 of the issue go through the command line in subprocesses (tiny synthetic runs);
the rest use the Python API. The fault drill kills a checkpointing run with SIGKILL and resumes it.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit import rundir
from feddr_kit.__main__ import build_parser, main
from feddr_kit.errors import FeddrKitError
from feddr_kit.federated import schedule_note
from feddr_kit.models import IMAGE_SIZES, build_model

REPO = Path(__file__).resolve().parents[1]
# P of the issue, at the smallest scale; every evaluated round is checkpointed.
CLI = [sys.executable, "-m", "feddr_kit", "run", "--dataset", "synthetic", "--model", "cnn", "--shards-per-client", "2", "--num-clients", "10",
       "--clients-per-round", "2", "--local-epochs", "1", "--progress", "false", "--eval-every", "1",
       "--checkpoint-every", "1", "--lr-gamma", "1"]
TINY = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2, local_epochs=1,
            eval_every=1, progress=False)


def start(*args: str, cwd: Path) -> subprocess.Popen:
    """Start ``python -m feddr_kit run`` (this checkout's feddr_kit) with the tiny flags and ``args``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([*CLI, *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(*procs: subprocess.Popen) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of each process, once it has ended (at most 5 min)."""
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append((p.returncode, stdout, stderr))
    return out


def cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    return finish(start(*args, cwd=cwd))[0]


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def done2(tmp_path_factory) -> Path:
    """A CLI run of 2 rounds (feddr+, constant lr), checkpointed: copy it before changing it."""
    folder = tmp_path_factory.mktemp("done2")
    rc, out, err = cli("--rounds", "2", "--out-dir", "run", cwd=folder)
    assert rc == 0, err
    return folder / "run"


@pytest.fixture
def copy_of_done2(done2, tmp_path) -> Path:
    shutil.copytree(done2, tmp_path / "run")
    return tmp_path / "run"


# --------------------------------------------------------------------------- 1-5: out_dir ownership
def test_two_runs_into_one_folder_one_is_refused_and_the_other_is_intact(tmp_path, synthetic):
    # Run A holds the folder (paused in its callback) while run B starts from the command line, so the
    # two overlap on any machine; before the fix both "succeeded" and their files mixed.
    import threading

    folder = tmp_path / "x"
    holding, release, outcome = threading.Event(), threading.Event(), {}

    def pause_after_round_two(row):
        if row["round"] == 2:
            holding.set()
            assert release.wait(300)

    def run_a():
        try:
            outcome["result"] = fk.run(fk.Config(seed=1, out_dir=str(folder), checkpoint_every=1,
                                                 lr_gamma=1.0, **{**TINY, "rounds": 4}),
                                       data=synthetic, callback=pause_after_round_two)
        except BaseException as err:  # reported by the main thread
            outcome["error"] = err
            holding.set()

    a = threading.Thread(target=run_a)
    a.start()
    try:
        assert holding.wait(300) and "error" not in outcome, outcome
        rc, _, loser_err = cli("--rounds", "4", "--out-dir", "x", "--seed", "2", "--algorithm", "fedavg", cwd=tmp_path)
    finally:
        release.set()
        a.join(300)
    assert "error" not in outcome, outcome
    assert rc == 2 and len(error_lines(loser_err)) == 1 and "in use by another run" in loser_err, loser_err
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    ckpt = torch.load(folder / "checkpoint.pt", weights_only=False)
    history = pd.read_csv(folder / "history.csv")
    assert config["algorithm"] == summary["algorithm"] == ckpt["config"]["algorithm"] == "feddr+"
    assert config["seed"] == summary["seed"] == ckpt["config"]["seed"] == 1
    assert list(history["round"]) == [1, 2, 3, 4] == [row["round"] for row in ckpt["history"]]
    assert summary["final_acc"] == pytest.approx(history["test_acc"].iloc[-1])
    assert summary["final_acc"] == pytest.approx(outcome["result"].summary["final_acc"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(rundir.RESULT_FILES)  # no lock, no temp file


def test_fresh_run_into_a_folder_with_results_needs_overwrite_which_clears_them(copy_of_done2):
    before = snapshot(copy_of_done2)
    rc, _, err = cli("--rounds", "3", "--seed", "5", "--out-dir", "run", cwd=copy_of_done2.parent)
    assert rc == 2 and "already holds" in error_lines(err)[0] and "--overwrite" in err, err
    assert snapshot(copy_of_done2) == before
    # Overwrite clears the old results first: a replacement that dies at once leaves none of them behind.
    rc, _, err = cli("--rounds", "3", "--seed", "5", "--lr", "1e30", "--overwrite", "--out-dir", "run",
                     cwd=copy_of_done2.parent)
    assert rc == 1 and len(error_lines(err)) == 1, err
    assert sorted(p.name for p in copy_of_done2.iterdir()) == ["config.json"]
    assert json.loads((copy_of_done2 / "config.json").read_text())["seed"] == 5


def test_resume_with_fewer_rounds_than_done_is_an_error(copy_of_done2):
    before = snapshot(copy_of_done2)
    rc, _, err = cli("--rounds", "1", "--resume", "--out-dir", "run", cwd=copy_of_done2.parent)
    assert rc == 2 and "2 rounds are already done" in error_lines(err)[0], err
    assert snapshot(copy_of_done2) == before


def test_next_start_removes_temporary_files_of_killed_runs(synthetic, tmp_path):
    cfg = fk.Config(out_dir=str(tmp_path), checkpoint_every=1, **TINY)
    fk.run(cfg, data=synthetic)
    debris = [tmp_path / ".checkpoint.pt.k1ll3d.tmp", tmp_path / ".history.csv.abc.tmp"]
    for p in debris:
        p.write_bytes(b"\0" * 1000)
    keep = tmp_path / "notes.tmp"  # not the kit's: left alone
    keep.write_text("mine")
    with pytest.warns(UserWarning, match="resuming with rounds=3"):
        fk.run(cfg.replace(rounds=3), data=synthetic, resume=True)
    assert not any(p.exists() for p in debris) and keep.exists()


def test_a_stale_lock_is_taken_over_with_a_warning(synthetic, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid belongs to no live process now
    (tmp_path / ".lock").write_text(f"pid {dead.pid} on here\n")
    with pytest.warns(UserWarning, match=f"no longer exists.*pid {dead.pid}"):
        fk.run(fk.Config(out_dir=str(tmp_path), **TINY), data=synthetic)
    assert not (tmp_path / ".lock").exists() and (tmp_path / "summary.json").exists()


def test_a_locked_folder_is_refused_by_the_python_api_too(synthetic, tmp_path):
    def nested(row):  # while the outer run holds the folder
        with pytest.raises(FeddrKitError, match="in use by another run"):
            fk.run(fk.Config(out_dir=str(tmp_path), overwrite=True, **TINY), data=synthetic)
        calls.append(row)

    calls = []
    fk.run(fk.Config(out_dir=str(tmp_path), **TINY), data=synthetic, callback=nested)
    assert len(calls) == 2


def test_result_files_get_the_mode_of_a_plain_open(synthetic, tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert rundir.FILE_MODE == 0o666 & ~mask == stat.S_IMODE(plain.stat().st_mode)
    fk.run(fk.Config(out_dir=str(tmp_path / "run"), **TINY), data=synthetic)
    for name in rundir.RESULT_FILES:
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == rundir.FILE_MODE, name


# --------------------------------------------------------------------------- 6-8: one-line errors, CLI
def test_divergence_is_one_line_and_a_smaller_lr_resumes_it(copy_of_done2):
    cwd, ckpt_before = copy_of_done2.parent, (copy_of_done2 / "checkpoint.pt").read_bytes()
    rc, _, err = cli("--rounds", "4", "--lr", "1e30", "--resume", "--out-dir", "run", cwd=cwd)
    assert rc == 1, err
    (line,) = error_lines(err)
    assert line.startswith("error: round 3, client ") and "lr=1e+30" in line and "smaller learning rate" in line
    # item 17: the resume warnings are plain sentences, no source line
    warning_lines = [ln for ln in err.splitlines() if not ln.startswith("error:")]
    assert warning_lines and all(ln.startswith("warning: resuming with") for ln in warning_lines), err
    assert (copy_of_done2 / "checkpoint.pt").read_bytes() == ckpt_before

    rc, out, err = cli("--rounds", "4", "--lr", "0.01", "--resume", "--out-dir", "run", cwd=cwd)
    assert rc == 0, err
    history = pd.read_csv(copy_of_done2 / "history.csv")
    default_lr = fk.algorithms.get_algorithm(fk.Config(algorithm="feddr+")).initial_lr("cnn")
    assert list(history["round"]) == [1, 2, 3, 4]
    assert list(history["lr"]) == [default_lr, default_lr, 0.01, 0.01]
    assert json.loads((copy_of_done2 / "config.json").read_text())["lr"] == 0.01
    assert json.loads((copy_of_done2 / "summary.json").read_text())["lr0"] == 0.01


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "no keys"])
def test_unreadable_checkpoint_is_one_line_naming_the_file_and_kept(copy_of_done2, damage):
    path = copy_of_done2 / "checkpoint.pt"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    else:
        torch.save({"version": 1, "weights": torch.zeros(3)}, path)
    damaged = path.read_bytes()
    rc, _, err = cli("--rounds", "3", "--resume", "--out-dir", "run", cwd=copy_of_done2.parent)
    assert rc == 2, err
    (line,) = error_lines(err)
    assert str(Path("run") / "checkpoint.pt") in line and "unreadable" in line
    assert path.read_bytes() == damaged


def test_checkpoint_of_an_unknown_version_is_refused_in_one_line_and_kept(copy_of_done2):
    path = copy_of_done2 / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=False)
    ckpt["version"] = rundir.CHECKPOINT_VERSION + 1  # written by a later layout
    torch.save(ckpt, path)
    written = path.read_bytes()
    rc, _, err = cli("--rounds", "3", "--resume", "--out-dir", "run", cwd=copy_of_done2.parent)
    assert rc == 2, err
    (line,) = error_lines(err)
    assert f"version {rundir.CHECKPOINT_VERSION + 1}" in line and f"reads version {rundir.CHECKPOINT_VERSION}" in line
    assert path.read_bytes() == written


def test_unusable_out_dir_is_refused_before_any_data_is_loaded(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    cases = {"is a file": a_file, "cannot create": a_file / "sub", "cannot create ": "/proc/feddr_kit_run"}
    if os.geteuid() != 0:  # root writes into read-only folders
        read_only = tmp_path / "read_only"
        read_only.mkdir(mode=0o555)
        cases["cannot write"] = read_only
    # The data path does not exist either: the out_dir error coming first shows out_dir is checked first.
    procs = [start("--dataset", "imagefolder", "--data-path", str(tmp_path / "no_data"), "--out-dir", str(path),
                   cwd=tmp_path) for path in cases.values()]
    for (needle, path), (rc, _, err) in zip(cases.items(), finish(*procs)):
        assert rc == 2, err
        (line,) = error_lines(err)
        assert line.startswith("error: out_dir:") and needle.strip() in line and str(path) in line, line


# --------------------------------------------------------------------------- 9-11: bad input, Python API
@pytest.mark.parametrize("name", list(IMAGE_SIZES))
def test_image_size_table_matches_what_torch_accepts(name):
    low, high = IMAGE_SIZES[name]
    model = build_model(name, 10).train()

    def runs(side: int) -> bool:  # a one-image training batch: the hardest case for batch statistics
        try:
            model(torch.zeros(1, 3, side, side))
            return True
        except (RuntimeError, ValueError):
            return False

    assert runs(low) and not runs(low - 1)
    if high is not None:
        assert runs(high) and not runs(high + 1)
    with pytest.raises(FeddrKitError, match=f"model '{name}' takes images of .*{low}x{low}.*8x8"):
        build_model(name, 10, image_size=8)


def test_cnn_bn_refuses_odd_sides_in_one_line():
    # its space-to-depth stem takes 2x2 blocks: torch's own error would come from inside pixel_unshuffle
    with pytest.raises(FeddrKitError, match="model 'cnn_bn' takes images whose sides are multiples of 2 pixels, but these are 33x34"):
        build_model("cnn_bn", 10, image_size=(33, 34))
    build_model("cnn_bn", 10, image_size=(34, 34))


def test_a_registered_model_runs_and_a_taken_name_is_refused(monkeypatch, synthetic):
    from torch import nn

    from feddr_kit import models
    for name in ("_BUILDERS", "IMAGE_SIZES", "SIDE_MULTIPLES"):  # registration is for the process: undo it after
        monkeypatch.setattr(models, name, dict(getattr(models, name)))
    monkeypatch.setattr(models, "MODELS", models.MODELS)
    models.register("tiny_linear", lambda: (nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 16)), 16), (8, None))
    assert "tiny_linear" in models.MODELS
    result = fk.run(fk.Config(**{**TINY, "model": "tiny_linear", "lr": 0.05, "rounds": 1}), data=synthetic)
    assert result.model.head.weight.shape == (synthetic.num_classes, 16)
    with pytest.raises(FeddrKitError, match="register: the model name must be a new non-empty string, got 'cnn_bn' .already"):
        models.register("cnn_bn", lambda: None, (8, None))
    with pytest.raises(FeddrKitError, match="register: builder must be a function"):
        models.register("other", "not callable", (8, None))


def test_run_refuses_images_smaller_than_the_model_takes():
    small = fk.data.synthetic(image_size=8)
    with pytest.raises(FeddrKitError, match="model 'cnn' takes images of 32x32.*8x8"):
        fk.run(fk.Config(**TINY), data=small)


def test_partition_of_other_data_is_refused(synthetic):
    bigger = fk.data.synthetic(train_per_class=300)
    part = fk.partition.shard(bigger.train_y, bigger.test_y, 10, 2, seed=0)
    with pytest.raises(FeddrKitError, match="partition: its train indices reach .* 1000 train images"):
        fk.run(fk.Config(**TINY), data=synthetic, partition=part)


@pytest.mark.parametrize("field,value,needle", [
    ("progress", "false", "progress must be True or False"), ("probes", "yes", "probes must be True or False"),
    ("overwrite", 1, "overwrite must be True or False"), ("out_dir", 123, "out_dir must be a folder path"),
    ("lr_decay_at", 0.5, r"lr_decay_at must be a list of fractions"), ("lr_decay_at", [0.5, 1.5], "lr_decay_at"),
    ("lr", float("inf"), "lr must be a finite number > 0, got inf"), ("weight_decay", -1.0, "a finite number >= 0"),
])
def test_config_type_checks(field, value, needle):
    with pytest.raises(FeddrKitError, match=needle):
        fk.Config(**{field: value})


def test_config_takes_numpy_numbers_and_paths(tmp_path):
    cfg = fk.Config(num_clients=np.int64(10), clients_per_round=np.int32(2), lr=np.float64(0.05),
                    beta=np.float32(0.5), probes=np.bool_(True), lr_decay_at=np.array([0.5]), out_dir=tmp_path)
    assert (cfg.num_clients, cfg.lr, cfg.beta, cfg.probes, cfg.lr_decay_at, cfg.out_dir) == \
        (10, 0.05, 0.5, True, (0.5,), str(tmp_path))
    assert type(cfg.num_clients) is int and type(cfg.lr) is float and type(cfg.probes) is bool
    assert fk.Config.from_dict(json.loads(cfg.to_json())) == cfg


# --------------------------------------------------------------------------- 12-17
def test_regularizer_none_means_none_and_runs_record_the_one_used(synthetic, tmp_path):
    assert build_parser().parse_args(["run", "--regularizer", "none"]).regularizer == "none"
    assert build_parser().parse_args(["run"]).regularizer is None
    without = fk.run(fk.Config(algorithm="feddr+", regularizer="none", **TINY), data=synthetic)
    dr = fk.run(fk.Config(algorithm="dr", **TINY), data=synthetic)  # FedDr+ is DR plus FD
    pd.testing.assert_frame_equal(without.history.drop(columns="seconds"), dr.history.drop(columns="seconds"))
    result = fk.run(fk.Config(algorithm="feddr+", out_dir=str(tmp_path), **TINY), data=synthetic)
    assert result.config.regularizer == result.summary["regularizer"] == "fd"
    assert json.loads((tmp_path / "config.json").read_text())["regularizer"] == "fd"
    assert json.loads((tmp_path / "summary.json").read_text())["regularizer"] == "fd"


def test_resume_of_a_checkpoint_that_saved_regularizer_none(synthetic, tmp_path):
    cfg = fk.Config(algorithm="feddr+", out_dir=str(tmp_path), checkpoint_every=1, lr_gamma=1.0, **TINY)
    straight = fk.run(cfg.replace(out_dir=str(tmp_path / "straight"), rounds=3), data=synthetic)
    fk.run(cfg, data=synthetic)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    ckpt["config"]["regularizer"] = None  # as older versions saved it (before a run recorded the regularizer it used)
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.warns(UserWarning, match="resuming with rounds=3 instead of 2"):
        resumed = fk.run(cfg.replace(rounds=3), data=synthetic, resume=True)
    pd.testing.assert_frame_equal(straight.history.drop(columns="seconds"), resumed.history.drop(columns="seconds"))


def test_out_dir_none_is_refused_and_help_says_so(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--out-dir", "none"])
    assert exit_.value.code == 2 and "leave out --out-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "the word none is refused" in " ".join(capsys.readouterr().out.split())


def test_summary_names_the_initial_lr_lr0(synthetic):
    summary = fk.run(fk.Config(lr=0.02, lr_gamma=0.5, **TINY), data=synthetic).summary
    assert summary["lr0"] == 0.02 and "lr" not in summary


@pytest.mark.parametrize("changes,first_low_round", [
    (dict(rounds=2), 2), (dict(rounds=1), 1), (dict(rounds=4, eval_every=1), None),
    (dict(rounds=40, eval_every=5), None), (dict(rounds=10, eval_every=5), 6), (dict(rounds=2, lr_gamma=1.0), None),
    (dict(rounds=2, lr_decay_at=()), None),
])
def test_schedule_note_when_the_lr_falls_before_the_second_evaluation(changes, first_low_round):
    # Hand-computed: milestone int(0.5 * rounds) (0-based round index) against the second evaluated round.
    note = schedule_note(fk.Config(**changes))
    if first_low_round is None:
        assert note is None
    else:
        assert note.startswith("note:") and f"from round {first_low_round} on" in note and "\n" not in note


def test_schedule_note_does_not_walk_every_round(monkeypatch):
    # Start-up must not grow with the rounds: the note is built from the first two evaluations alone. A
    # range() of this module that stops past 1000 items fails a walk over the rounds at once.
    from feddr_kit import schedule

    def short_range(*args):
        for i, t in enumerate(range(*args)):
            assert i < 1000, f"the schedule note walked past 1000 of range{args}"
            yield t

    monkeypatch.setattr(schedule, "range", short_range, raising=False)
    rounds, every = 3 * 10**11, 10**11  # 1.5e11 rounds at lr0, the second evaluation after round 2e11
    note = schedule_note(fk.Config(rounds=rounds, eval_every=every))
    assert f"from round {rounds // 2 + 1} on" in note
    assert schedule_note(fk.Config(rounds=rounds, eval_every=1)) is None


def test_cli_prints_the_schedule_note(tmp_path, capsys):
    assert main(["run", "--dataset", "synthetic", "--num-clients", "10", "--clients-per-round", "2", "--rounds", "2",
                 "--local-epochs", "1", "--progress", "false"]) == 0
    assert "the lr drops from round 2 on" in capsys.readouterr().err


def test_failed_download_leaves_no_new_folder(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    def offline(url, root, **kw):  # what torchvision does offline: make its folder, then fail to connect
        os.makedirs(root, exist_ok=True)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(cifar, "download_and_extract_archive", offline)
    monkeypatch.setenv("FEDDR_DATA_DIR", str(tmp_path / "new" / "dd"))
    with pytest.raises(FeddrKitError, match="download failed"):
        fk.data.load("cifar10")
    assert list(tmp_path.iterdir()) == []


def test_no_arguments_lists_the_commands_and_an_example(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "run" in err and "sweep" in err and "examples:" in err and "python -m feddr_kit run --dataset synthetic" in err


def test_readme_and_quickstart_agree_on_classes_per_client():
    # Two of a client's shards can come from one class, so "5 classes each" is wrong for some clients.
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / "00_quickstart.ipynb", as_version=4)
    readme = (REPO / "README.md").read_text()
    for text in (readme, nb.cells[0].source):
        assert "5 shards (at most 5 classes) each" in text and "5 classes each" not in text
    part = fk.partition.shard(np.repeat(np.arange(10), 100), np.repeat(np.arange(10), 50), 100, 5, seed=0)
    per_client = (part.counts("train") > 0).sum(axis=1)
    assert per_client.max() == 5 and per_client.min() < 5


# --------------------------------------------------------------------------- the fault drill
@pytest.mark.slow  # about a minute: seven CLI processes, each importing torch
def test_fault_drill_kill9_then_resume_equals_an_uninterrupted_run(tmp_path):
    args = ["--rounds", "8", "--algorithm", "feddr+", "--probes", "true", "--probe-samples", "50"]
    rc, _, err = cli(*args, "--out-dir", "straight", cwd=tmp_path)
    assert rc == 0, err
    # Kill moments are drawn from the run's progress, not from wall time, so that a loaded machine
    # cannot turn the drill into runs that finish before their kill: each killed run is first let past
    # the next one or two rounds (never the last two), then killed at a random moment
    # within the next half round (mid-training or mid-checkpoint-write).
    rounds = 8
    half_round = 0.5 * json.loads((tmp_path / "straight" / "summary.json").read_text())["total_seconds"] / rounds
    drilled, rng, kills = tmp_path / "drilled", random.Random(0), 0
    deadline = time.monotonic() + 240
    while kills < 5 and time.monotonic() < deadline:
        done = _rounds_saved(drilled)
        if done > rounds - 3:
            break
        target = min(rounds - 2, done + rng.randint(1, 2))
        again = ["--resume"] if (drilled / "checkpoint.pt").exists() else ["--overwrite"]
        proc = start(*args, *again, "--out-dir", "drilled", cwd=tmp_path)
        while proc.poll() is None and _rounds_saved(drilled) < target:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, half_round))
        if proc.poll() is not None:
            break  # it finished before the kill
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
    assert kills >= 2
    again = ["--resume"] if (drilled / "checkpoint.pt").exists() else ["--overwrite"]
    rc, _, err = cli(*args, *again, "--out-dir", "drilled", cwd=tmp_path)  # to the end (or re-summarize the end)
    assert rc == 0, err
    a = pd.read_csv(tmp_path / "straight" / "history.csv").drop(columns="seconds")
    b = pd.read_csv(drilled / "history.csv").drop(columns="seconds")
    pd.testing.assert_frame_equal(a, b)
    wa = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=False)["global_state"]
    wb = torch.load(drilled / "checkpoint.pt", weights_only=False)["global_state"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not list(drilled.glob("*.tmp")) and not list(drilled.glob(".*.tmp")) and not (drilled / ".lock").exists()


def _rounds_saved(folder: Path) -> int:
    """How many rounds ``folder``'s history.csv holds (0 when it has none yet, or is being replaced)."""
    text = _read(folder / "history.csv")
    return max(0, len(text.splitlines()) - 1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
