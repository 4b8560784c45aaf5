"""Nothing lost under a second run or sweep, a full disk or a broken file; one-line messages on the way.

Each test reproduces one fault of a drill (a divergence before the first checkpoint, a deleted lock, a
truncated history, a full disk, a resume that diverges or is killed, a second sweep on a live folder,
corrupt result files, changed data under a resume) and checks what a user should see. Runs are tiny
synthetic federations; the command line is called in-process through ``feddr_kit.__main__.main``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit import rundir
from feddr_kit.__main__ import build_parser, main
from feddr_kit.errors import DivergedError, FeddrKitError, StorageError
from test_reliability import error_lines, snapshot  # the CLI drill's helpers, shared

REPO = Path(__file__).resolve().parents[1]
TINY = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2,
            local_epochs=1, eval_every=1, progress=False, lr_gamma=1.0)
# The same run on the command line.
FLAGS = ["run", "--dataset", "synthetic", "--model", "cnn", "--shards-per-client", "2", "--num-clients", "10",
         "--clients-per-round", "2", "--local-epochs", "1", "--progress", "false", "--eval-every", "1",
         "--lr-gamma", "1"]

pytestmark = pytest.mark.usefixtures("one_thread")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m feddr_kit run`` with the tiny flags and ``args``, in this process: (code, stdout, stderr)."""
    capsys.readouterr()
    code = main([*FLAGS, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def finished(tmp_path_factory, synthetic) -> Path:
    """A finished 2-round run, checkpointed every round: copy it before changing it."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    fk.run(fk.Config(out_dir=str(folder), checkpoint_every=1, **TINY), data=synthetic)
    return folder


@pytest.fixture
def copy_of_finished(finished, tmp_path) -> Path:
    import shutil

    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


# --------------------------------------------------------------------------- a divergence before any checkpoint
def test_a_divergence_before_the_first_checkpoint_advises_a_fresh_run_that_then_works(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "--rounds", "2", "--lr", "1e30", "--out-dir", "run")  # checkpoint_every 5: none yet
    assert code == 1, err
    (line,) = error_lines(err)
    assert "no checkpoint was written" in line and "without resume" in line, line
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json"]
    # The advice works: no --resume, no --overwrite needed for a folder that holds only a config.
    code, _, err = cli(capsys, "--rounds", "2", "--lr", "0.01", "--out-dir", "run")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "config.json").read_text())["lr"] == 0.01


def test_a_divergence_after_a_checkpoint_advises_resuming_it(copy_of_finished, capsys, monkeypatch):
    monkeypatch.chdir(copy_of_finished.parent)
    code, _, err = cli(capsys, "--rounds", "3", "--lr", "1e30", "--resume", "--out-dir", "run")
    assert code == 1, err
    (line,) = error_lines(err)
    assert "after round 2" in line and "resume from it with a smaller lr" in line, line


# --------------------------------------------------------------------------- the lock
def test_a_deleted_lock_stops_the_first_run_before_it_writes_over_the_second(tmp_path, synthetic):
    # While run A holds the folder its .lock is deleted and run B (another process) claims the folder and
    # finishes. A must not go on writing over B's results: it stops at its next write, naming the lock.
    folder = tmp_path / "x"
    second = {}

    def delete_lock_and_run_another(row):
        if row["round"] == 1:
            (folder / ".lock").unlink()
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            second["proc"] = subprocess.run(
                [sys.executable, "-m", "feddr_kit", *FLAGS, "--rounds", "2", "--seed", "7", "--overwrite",
                 "--checkpoint-every", "1", "--out-dir", str(folder)], env=env, capture_output=True, text=True)

    with pytest.raises(FeddrKitError, match="lock file .* was removed"):
        fk.run(fk.Config(out_dir=str(folder), checkpoint_every=1, **{**TINY, "rounds": 3}), data=synthetic,
               callback=delete_lock_and_run_another)
    assert second["proc"].returncode == 0, second["proc"].stderr
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    ckpt = torch.load(folder / "checkpoint.pt", weights_only=False)
    assert config["seed"] == summary["seed"] == ckpt["config"]["seed"] == 7 and ckpt["next_round"] == 2


def test_the_lock_is_the_filelock_packages_and_refuses_a_second_owner(tmp_path):
    import filelock

    with rundir.claim(tmp_path, resume=False, overwrite=False):
        assert f"pid {os.getpid()}" in (tmp_path / ".lock").read_text()
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(tmp_path / ".lock", timeout=0, thread_local=False).acquire()
        with pytest.raises(FeddrKitError, match=f"in use by another run \\(pid {os.getpid()}"):
            with rundir.claim(tmp_path, resume=True, overwrite=False):
                pass
    assert not (tmp_path / ".lock").exists()


# --------------------------------------------------------------------------- files out of step
def test_resuming_a_finished_run_mends_a_truncated_history(copy_of_finished, synthetic):
    history = copy_of_finished / "history.csv"
    whole = history.read_bytes()
    history.write_bytes(whole[: len(whole) * 2 // 3])
    fk.run(fk.Config(out_dir=str(copy_of_finished), checkpoint_every=1, **TINY), data=synthetic, resume=True)
    assert history.read_bytes() == whole


def test_a_resume_that_diverges_leaves_the_folder_as_it_was(copy_of_finished, synthetic):
    before = snapshot(copy_of_finished)
    with pytest.raises(DivergedError):
        fk.run(fk.Config(out_dir=str(copy_of_finished), checkpoint_every=1, **{**TINY, "rounds": 4, "lr": 1e30}),
               data=synthetic, resume=True)
    assert snapshot(copy_of_finished) == before


def test_a_resume_killed_after_a_checkpoint_leaves_config_and_checkpoint_agreeing(copy_of_finished, synthetic):
    def interrupt(row):
        if row["round"] == 4:  # the checkpoint of round 3 is written; the one of round 4 is not
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fk.run(fk.Config(out_dir=str(copy_of_finished), checkpoint_every=1, **{**TINY, "rounds": 5, "lr": 0.02}),
               data=synthetic, resume=True, callback=interrupt)
    config = json.loads((copy_of_finished / "config.json").read_text())
    ckpt = torch.load(copy_of_finished / "checkpoint.pt", weights_only=False)
    assert ckpt["next_round"] == 3 and config == ckpt["config"] and config["rounds"] == 5 and config["lr"] == 0.02
    assert not (copy_of_finished / "summary.json").exists()  # the 2-round summary no longer describes the folder
    assert list(pd.read_csv(copy_of_finished / "history.csv")["round"]) == [1, 2, 3]


# --------------------------------------------------------------------------- a full disk
@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), OSError(27, "File too large")])
def test_a_full_disk_is_one_line_with_its_own_exit_code_and_the_resume_is_exact(tmp_path, capsys, monkeypatch,
                                                                                 failure):
    monkeypatch.chdir(tmp_path)
    args = ["--rounds", "3", "--checkpoint-every", "1"]
    assert cli(capsys, *args, "--out-dir", "straight")[0] == 0
    real_write, saves = Path.write_bytes, []

    def write_then_fill_the_disk(path, data):
        if "checkpoint.pt" in path.name:
            saves.append(path)
            if len(saves) == 2:
                real_write(path, data[:100])  # a partly written temporary file
                raise failure
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_then_fill_the_disk)
    code, _, err = cli(capsys, *args, "--out-dir", "full")
    assert code == 3, err
    (line,) = error_lines(err)
    assert f"cannot write {Path('full') / 'checkpoint.pt'}" in line and "resume" in line, line
    assert not list((tmp_path / "full").glob(".*.tmp")) and not (tmp_path / "full" / ".lock").exists()
    assert torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)["next_round"] == 1
    monkeypatch.setattr(Path, "write_bytes", real_write)  # space freed
    assert cli(capsys, *args, "--resume", "--out-dir", "full")[0] == 0
    a, b = (pd.read_csv(tmp_path / name / "history.csv").drop(columns="seconds") for name in ("straight", "full"))
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.skipif(not hasattr(__import__("resource"), "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_checkpoint_that_does_not_fit_is_the_os_error_named_and_the_process_lives_on(tmp_path):
    """A real short write (a file-size limit below the checkpoint's size, at several points in the file): a
    StorageError in the OS's words, the process carrying on after it, no temporary file left. torch's own
    file writer reported such a write in its archive's words and could abort the process as it closed."""
    code = f"""
import resource
from pathlib import Path
import torch
from feddr_kit import rundir
folder = Path({str(tmp_path)!r})
payload = {{"global_state": {{"w": torch.arange(4096, dtype=torch.float32)}}, "history": list(range(500))}}
size = len(rundir.torch_bytes(payload))
with rundir.claim(folder, resume=True, overwrite=False):
    for limit in (64, size // 3, size // 2, size - 200, size - 1):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            rundir.write_bytes(folder / "checkpoint.pt", rundir.torch_bytes(payload))
        except rundir.StorageError as err:
            print("stopped:", err)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    rundir.write_bytes(folder / "checkpoint.pt", rundir.torch_bytes(payload))
print("lived on")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stderr == "", out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 6 and lines[-1] == "lived on", out.stdout
    assert all(line.startswith("stopped: cannot write ") and "(File too large;" in line for line in lines[:5]), out.stdout
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["history"] == list(range(500))
    assert not list(tmp_path.glob(".*.tmp"))


def test_storage_error_is_a_feddr_kit_error_and_an_os_error():
    assert issubclass(StorageError, FeddrKitError) and issubclass(StorageError, OSError)


# --------------------------------------------------------------------------- the command line
def test_ctrl_c_prints_one_line_releases_the_folder_and_the_resume_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real_end = fk.roundlog.RoundLog.end_round

    def end_then_interrupt(self, plan, *a, **kw):
        row = real_end(self, plan, *a, **kw)
        if plan.round == 1:
            raise KeyboardInterrupt
        return row

    monkeypatch.setattr(fk.roundlog.RoundLog, "end_round", end_then_interrupt)
    code, _, err = cli(capsys, "--rounds", "3", "--checkpoint-every", "1", "--out-dir", "run")
    assert code == 130 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.strip()] == [err.strip()] and err.startswith("interrupted")
    assert not (tmp_path / "run" / ".lock").exists()
    monkeypatch.setattr(fk.roundlog.RoundLog, "end_round", real_end)
    assert cli(capsys, "--rounds", "3", "--checkpoint-every", "1", "--resume", "--out-dir", "run")[0] == 0


def test_the_lr_warning_of_a_resume_names_the_lr_the_run_used(copy_of_finished, synthetic):
    used = fk.federated.initial_lr(fk.Config(**TINY))
    with pytest.warns(UserWarning, match=f"resuming with lr=0.01 instead of {used} "):
        fk.run(fk.Config(out_dir=str(copy_of_finished), **{**TINY, "rounds": 3, "lr": 0.01}), data=synthetic,
               resume=True)


@pytest.mark.parametrize("argv", [["run", "--round", "2"], ["sweep", "--gri", "g.json", "--root", "x"],
                                  ["flower", "--round", "2"]])
def test_flags_are_never_abbreviated(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "required: --grid" in err, err


# --------------------------------------------------------------------------- sweeps
SWEEP_BASE = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2,
                  local_epochs=1, eval_every=1, checkpoint_every=1, lr=0.05)


@pytest.fixture(scope="module")
def tiny():
    return fk.data.synthetic(train_per_class=20, test_per_class=10)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny) -> Path:
    """A finished sweep of two runs (fedavg, dr): copy it before changing it."""
    root = tmp_path_factory.mktemp("swept") / "root"
    fk.sweep.run(SWEEP_BASE, {"algorithm": ["fedavg", "dr"]}, [0], root, data=tiny, progress=False)
    return root


@pytest.fixture
def copy_of_swept(swept, tmp_path) -> Path:
    import shutil

    shutil.copytree(swept, tmp_path / "root")
    return tmp_path / "root"


def test_a_sweep_leaves_a_folder_that_a_live_run_holds_untouched(tmp_path, tiny):
    root = tmp_path / "root"
    held = root / "algorithm=dr__seed=0"
    grid = {"algorithm": ["fedavg", "dr"]}
    with rundir.claim(held, resume=False, overwrite=False):  # a live run, before its first checkpoint
        (held / "config.json").write_text(fk.Config(**SWEEP_BASE, algorithm="dr").to_json())
        before = snapshot(held)
        df = fk.sweep.run(SWEEP_BASE, grid, [0], root, data=tiny, progress=False)
        assert snapshot(held) == before  # its config.json kept, no error.txt, no point.json
        assert dict(zip(df["name"], df["status"])) == {"algorithm=fedavg__seed=0": "done", "algorithm=dr__seed=0": "partial"}
    df = fk.sweep.run(SWEEP_BASE, grid, [0], root, data=tiny, progress=False)  # once it is free, the sweep runs it
    assert list(df["status"]) == ["done", "done"] and not list(root.glob("*/error.txt"))


def test_the_sweep_cli_names_a_held_folder_and_prints_a_lock_takeover_as_a_warning(tmp_path, capsys):
    root = tmp_path / "root"
    spec = tmp_path / "grid.json"
    spec.write_text(json.dumps({"base": {**SWEEP_BASE, "rounds": 1}, "grid": {"algorithm": ["fedavg", "dr"]}, "seeds": [0]}))
    (root / "algorithm=fedavg__seed=0").mkdir(parents=True)
    (root / "algorithm=fedavg__seed=0" / ".lock").write_text("pid 999999 on elsewhere\n")  # left by a killed run
    with rundir.claim(root / "algorithm=dr__seed=0", resume=False, overwrite=False):
        capsys.readouterr()
        code = main(["sweep", "--grid", str(spec), "--root", str(root), "--no-progress", "--jobs", "1"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "warning: taking over the lock of a run that no longer exists (pid 999999 on elsewhere)" in err, err
    assert "UserWarning" not in err and "Traceback" not in err, err
    assert "not finished: algorithm=dr__seed=0: held by another run" in out and "1 of 2 runs done" in out, out


@pytest.mark.parametrize("broken", ["summary.json", "point.json"])
def test_one_corrupt_file_costs_its_run_not_the_table(copy_of_swept, capsys, broken):
    (copy_of_swept / "algorithm=dr__seed=0" / broken).write_bytes(b'{"final_acc": 0.5, "rou')
    with pytest.warns(UserWarning, match=f"algorithm=dr__seed=0 .*cannot read .*{broken}"):
        df = fk.sweep.collect(copy_of_swept)
    assert dict(zip(df["name"], df["status"])) == {"algorithm=dr__seed=0": "unreadable",
                                                   "algorithm=fedavg__seed=0": "done"}
    assert list(fk.sweep.table(df, rows="algorithm").index) == ["fedavg"]
    spec = copy_of_swept.parent / "grid.json"
    spec.write_text(json.dumps({"base": SWEEP_BASE, "grid": {"algorithm": ["fedavg", "dr"]}, "seeds": [0]}))
    capsys.readouterr()
    code = main(["sweep", "--grid", str(spec), "--root", str(copy_of_swept), "--no-progress", "--jobs", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "fedavg" in out, err
    assert code == 1 and "unreadable: algorithm=dr__seed=0: cannot read" in out and broken in out, out


@pytest.mark.parametrize("damage", ["undecodable", "truncated"])
def test_histories_names_a_damaged_history_and_leaves_it_out(copy_of_swept, damage):
    path = copy_of_swept / "algorithm=dr__seed=0" / "history.csv"
    whole = path.read_bytes()
    path.write_bytes(b"\xff\xfe\x00" + whole[3:] if damage == "undecodable" else whole[: len(whole) - 20])
    word = "cannot read" if damage == "undecodable" else "cut short"
    with pytest.warns(UserWarning, match=rf"algorithm=dr__seed=0/history\.csv.*{word}|{word}.*dr__seed=0/history\.csv"):
        df = fk.sweep.histories(copy_of_swept)
    assert set(df["name"]) == {"algorithm=fedavg__seed=0"} and not df["test_acc"].isna().any()


def test_two_grids_on_one_root_each_return_only_their_runs_in_grid_order(copy_of_swept, tiny):
    grid = {"algorithm": ["feddr+", "fedavg"]}  # a root holds one grid: the same base and fields, more values and seeds
    df = fk.sweep.run(SWEEP_BASE, grid, [1, 0], copy_of_swept, data=tiny, progress=False)
    assert list(df["name"]) == ["algorithm=feddr+__seed=1", "algorithm=fedavg__seed=1",
                                "algorithm=feddr+__seed=0", "algorithm=fedavg__seed=0"]
    assert len(fk.sweep.collect(copy_of_swept)) == 5  # the first grid's dr run is still there


def test_two_notebook_grids_on_one_root_each_return_only_their_runs_in_grid_order(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 1\nseed = 0\nout_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import json, pathlib\npathlib.Path(out_dir, 'results.json').write_text(json.dumps({'x2': 2 * x}))")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook = tmp_path / "tiny.ipynb"
    nbformat.write(nb, notebook)
    root = tmp_path / "grid"
    fk.sweep.run_notebook_grid(notebook, {"x": [5]}, [0], root, progress=False)
    df = fk.sweep.run_notebook_grid(notebook, {"x": [3, 1]}, [0], root, progress=False)
    assert list(df["name"]) == ["x=3__seed=0", "x=1__seed=0"] and list(df["x2"]) == [6, 2]


# --------------------------------------------------------------------------- broken files under fine-tuning
@pytest.mark.parametrize("damage", ["config not json", "config not a config", "checkpoint truncated"])
def test_finetune_of_a_folder_with_a_broken_file_is_one_line_naming_it(copy_of_finished, damage):
    if damage == "config not json":
        broken = copy_of_finished / "config.json"
        broken.write_text('{"dataset": "synth')
    elif damage == "config not a config":
        broken = copy_of_finished / "config.json"
        broken.write_text('{"rounds": -3}')
    else:
        broken = copy_of_finished / "checkpoint.pt"
        broken.write_bytes(broken.read_bytes()[:5000])
    with pytest.raises(FeddrKitError) as err:
        fk.personalize.finetune(copy_of_finished)
    assert str(broken) in str(err.value) and "\n" not in str(err.value), err.value
    assert type(err.value) is FeddrKitError and err.value.__cause__ is None


# --------------------------------------------------------------------------- changed data under a resume
def _stopped_after_round_one(folder: Path, data) -> None:
    def stop(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fk.run(fk.Config(out_dir=str(folder), checkpoint_every=1, **{**TINY, "rounds": 3}), data=data, callback=stop)


def test_a_resume_on_changed_data_is_refused_naming_what_changed(tmp_path, synthetic):
    import dataclasses

    _stopped_after_round_one(tmp_path, synthetic)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    saved = ckpt[rundir.DATA_KEY]
    assert saved["train_size"] == len(synthetic.train_y) and len(saved["train_label_counts"]) == 10
    # 30 more training images of class 3, as when images are added to an image folder
    grown = dataclasses.replace(synthetic, train_x=torch.cat([synthetic.train_x, synthetic.train_x[:30]]),
                                train_y=torch.cat([synthetic.train_y, torch.full((30,), 3)]))
    before = snapshot(tmp_path)
    with pytest.raises(FeddrKitError, match=rf"data or partition changed .*train set size {len(synthetic.train_y)} -> "
                                            rf"{len(synthetic.train_y) + 30}; train label counts of class\(es\) 3; .*partition"):
        fk.run(fk.Config(out_dir=str(tmp_path), checkpoint_every=1, **{**TINY, "rounds": 3}), data=grown, resume=True)
    assert snapshot(tmp_path) == before
    # The same data but another partition of it (the caller's own)
    other = fk.partition.shard(synthetic.train_y, synthetic.test_y, num_clients=10, shards_per_client=2, seed=99)
    with pytest.raises(FeddrKitError, match=r"changed .*\(partition \(the clients' indices\)\)"):
        fk.run(fk.Config(out_dir=str(tmp_path), checkpoint_every=1, **{**TINY, "rounds": 3}), data=synthetic,
               partition=other, resume=True)
    # The data it was trained on: the resume goes on
    fk.run(fk.Config(out_dir=str(tmp_path), checkpoint_every=1, **{**TINY, "rounds": 3}), data=synthetic, resume=True)
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 3


def test_a_checkpoint_without_a_fingerprint_still_resumes(tmp_path, synthetic):
    _stopped_after_round_one(tmp_path, synthetic)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    del ckpt[rundir.DATA_KEY]  # as written before the kit recorded one
    assert ckpt["version"] == rundir.CHECKPOINT_VERSION
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    fk.run(fk.Config(out_dir=str(tmp_path), checkpoint_every=1, **{**TINY, "rounds": 3}), data=synthetic, resume=True)
    assert rundir.DATA_KEY in torch.load(tmp_path / "checkpoint.pt", weights_only=False)


# --------------------------------------------------------------------------- messages in the CLI's words
@pytest.mark.parametrize("args, field", [
    (["--partition", "dirichlet", "--num-clients", "200"], "num_clients"),   # 200 x 10 > the 1000 synthetic images
    (["--partition", "dirichlet", "--num-clients", "90", "--clients-per-round", "2", "--alpha", "0.001"], "alpha"),
    (["--partition", "reference", "--reference-partition", "no_such_file"], "reference_partition"),
])
def test_partition_errors_name_config_fields_not_function_arguments(args, field, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDR_REFERENCE_DIR", str(tmp_path))
    code, _, err = cli(capsys, "--rounds", "1", *args)
    assert code == 2, err
    (line,) = error_lines(err)
    assert line.startswith(f"error: {field}: "), line
    assert not any(word in line for word in ("min_size", "max_tries", "path_or_name")), line


# --------------------------------------------------------------------------- behaviours no test pinned
def test_finetune_leaves_spherefeds_orthonormal_head_bit_identical_and_says_so(synthetic, tmp_path, monkeypatch):
    from feddr_kit import local

    folder = tmp_path / "spherefed"
    fk.run(fk.Config(algorithm="spherefed", out_dir=str(folder), **{**TINY, "rounds": 1}), data=synthetic)
    global_head = torch.load(folder / "checkpoint.pt", weights_only=False)["global_state"]["head.weight"]
    heads, bodies = [], []
    real = local.train_client

    def spy(model, *args, **kw):
        body = model.state_dict()["body.0.weight"].clone()
        out = real(model, *args, **kw)
        heads.append(model.head.weight.detach().clone())
        bodies.append(not torch.equal(body, model.state_dict()["body.0.weight"]))
        return out

    monkeypatch.setattr(local, "train_client", spy)
    ft = fk.personalize.finetune(folder, epochs=1, lr=0.01, data=synthetic)
    assert ft.summary()["head_trained"] is False
    assert len(heads) == 10 and all(bodies)  # every client fine-tuned its body
    assert all(torch.equal(h, global_head) for h in heads)  # and never moved the head, not by one bit


def test_evaluation_never_augments(synthetic, monkeypatch):
    # Every evaluation path sees the test images as they are: no crop, no flip. Checked two ways: augment is
    # never called, and the accuracies equal a forward pass over the plain normalized images.
    r = fk.run(fk.Config(algorithm="fedavg", **{**TINY, "rounds": 1}), data=synthetic)
    model, algo, part = r.model, r.algorithm, r.partition
    calls = []
    real_augment = fk.data.ImageData.augment
    monkeypatch.setattr(fk.data.ImageData, "augment", lambda self, *a, **kw: calls.append(1) or real_augment(self, *a, **kw))
    evaluator = fk.evaluation.Evaluator(synthetic, part, 0)
    row = evaluator(model, algo)
    local_accs = [evaluator.client_accuracy(model, algo, k) for k in range(part.num_clients)]
    probe = fk.evaluation.probe_set(synthetic, 50, 0, model)
    fk.evaluation.probe_view(model, algo, synthetic, *probe)
    fk.personalize.finetune(r, epochs=0, data=synthetic)
    assert calls == []
    model.eval()
    with torch.no_grad():
        pred = algo.logits(model, model.features(synthetic.normalize(synthetic.test_x))).argmax(1)
    assert row["test_acc"] == pytest.approx((pred == synthetic.test_y).float().mean().item(), abs=1e-9)
    by_hand = [(pred[idx] == synthetic.test_y[idx]).float().mean().item() for idx in map(torch.as_tensor, part.test_indices)]
    assert local_accs == pytest.approx(by_hand, abs=1e-9)


def test_flower_equals_fk_run_bit_for_bit_on_clients_of_different_sizes(synthetic):
    pytest.importorskip("flwr")
    from feddr_kit import flower

    cfg = fk.Config(algorithm="feddr+", dataset="synthetic", num_clients=4, clients_per_round=3, partition="dirichlet",
                    alpha=0.3, rounds=2, local_epochs=1, eval_every=1, lr_gamma=1.0, progress=False, engine="serial",
                    device="cpu")
    kit = fk.run(cfg, data=synthetic)
    sizes = kit.partition.sizes
    assert len(set(sizes.tolist())) == 4 and sizes.max() > 1.2 * sizes.min()  # size-weighting differs from uniform
    on_flower = flower.run_in_process(cfg, data=synthetic)
    pd.testing.assert_frame_equal(kit.history.drop(columns="seconds"), on_flower.history.drop(columns="seconds"),
                                  check_exact=True)
    a, b = kit.model.state_dict(), on_flower.model.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[n], b[n]) for n in a)


# --------------------------------------------------------------------------- the personalized methods' switches
@pytest.mark.parametrize("n, batch, epochs, kit, reference", [(500, 50, 5, 50, 30), (500, 50, 1, 10, 22), (120, 50, 2, 6, 8)])
def test_perfedavg_takes_the_reference_codes_batch_pairs_behind_a_switch(n, batch, epochs, kit, reference):
    from feddr_kit.methods import get_algorithm

    steps = epochs * -(-n // batch)
    cfg = fk.Config(algorithm="perfedavg", local_epochs=epochs, batch_size=batch)
    assert cfg.perfedavg_steps == "kit" and get_algorithm(cfg).num_local_steps(steps) == kit
    assert get_algorithm(cfg.replace(perfedavg_steps="reference")).num_local_steps(steps) == reference


def test_perfedavg_reference_steps_run_and_an_unknown_value_is_refused(synthetic):
    r = fk.run(fk.Config(algorithm="perfedavg", perfedavg_steps="reference", weight_decay=0.0, **TINY), data=synthetic)
    assert "personalized_acc" in r.history
    with pytest.raises(FeddrKitError, match="perfedavg_steps must be one of kit, reference"):
        fk.Config(perfedavg_steps="paper")


def test_local_only_reference_schedule_decays_the_lr_and_keeps_each_clients_best_epoch(synthetic, monkeypatch):
    from feddr_kit import local

    lrs, accs = [], []
    real_train, real_acc = local.train_client, fk.evaluation.Evaluator.client_accuracy

    def spy_train(model, teacher, algo, data, idx, ctx, cfg, device, gen=None):
        lrs.append((ctx.client, ctx.lr))
        return real_train(model, teacher, algo, data, idx, ctx, cfg, device, gen=gen)

    def spy_acc(self, model, algo, k):
        accs.append((k, real_acc(self, model, algo, k)))
        return accs[-1][1]

    monkeypatch.setattr(local, "train_client", spy_train)
    monkeypatch.setattr(fk.evaluation.Evaluator, "client_accuracy", spy_acc)
    res = fk.personalize.local_only(fk.Config(**TINY), "ce", schedule="reference", epochs=4, lr=0.05, data=synthetic)
    assert [lr for k, lr in lrs if k == 0] == pytest.approx([0.05, 0.05, 0.005, 0.0005])
    for _, row in res.per_client.iterrows():
        mine = [a for k, a in accs if k == row["client"]]
        assert len(mine) == 4 and row["after"] == max(mine) and mine[int(row["best_epoch"]) - 1] == max(mine)
    assert res.info["schedule"] == "reference" and res.info["epochs"] == 4
    with pytest.raises(FeddrKitError, match="schedule must be one of kit, reference"):
        fk.personalize.local_only(fk.Config(**TINY), "ce", schedule="paper", data=synthetic)
