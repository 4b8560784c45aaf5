"""The file errors of ``export``, ``fk.load_model``, ``show`` and ``personalize``: one line each, never a traceback.

An unreadable input, or an output folder that cannot be written, is bad input: one line naming the file,
exit 2, found before the command does its work. A write that fails on the way (a full disk) is exit 3, and
leaves no torn or half-written file behind. One test per case of a fault drill on these commands; the
runs are tiny synthetic federations, the command line is called in-process.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.figure
import pytest

import feddr_kit as fk
from feddr_kit import local
from feddr_kit.__main__ import main
from feddr_kit.errors import FeddrKitError
from test_reliability import error_lines

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = dict(dataset="synthetic", model="cnn", num_clients=5, clients_per_round=2, shards_per_client=2, eval_every=1,
             batch_size=20, lr=0.05, seed=3, lr_gamma=1.0, rounds=2, progress=False, checkpoint_every=1)
FULL_DISK = OSError(28, "No space left on device")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, synthetic) -> Path:
    """A finished 2-round run and its export (``model.pt``, ``model.json``): copy before changing them."""
    folder = tmp_path_factory.mktemp("finished")
    fk.run(fk.Config(**SMALL, out_dir=str(folder / "run")), data=synthetic)
    assert main(["export", str(folder / "run"), "--to", str(folder / "model.pt")]) == 0
    return folder


@pytest.fixture
def work(finished, tmp_path) -> Path:
    """A copy of :func:`finished` to change."""
    shutil.copytree(finished, tmp_path / "w")
    return tmp_path / "w"


def command(capsys, *argv: str) -> tuple[int, str]:
    """``python -m feddr_kit *argv`` in this process: (exit code, its one error line, or "" when none)."""
    capsys.readouterr()
    code = main(list(argv))
    lines = error_lines(capsys.readouterr().err)  # fails on a traceback
    assert len(lines) <= 1, lines
    return code, (lines or [""])[0]


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def no_data_loading(monkeypatch):
    """Fail the test if a command loads its dataset (the work an unwritable destination must prevent)."""
    def refuse(cfg):
        raise AssertionError("the data was loaded before the destination was checked")

    monkeypatch.setattr(fk.export, "load_data", refuse)


# --------------------------------------------------------------------------- export
def test_export_to_a_path_through_a_file_is_one_line_before_the_work(work, capsys, no_data_loading):
    (work / "afile").write_text("x")
    before = files(work)
    code, line = command(capsys, "export", str(work / "run"), "--to", str(work / "afile" / "model.pt"))
    assert code == 2 and "--to" in line and "afile" in line and "is a file" in line, line
    assert files(work) == before


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder nobody can write in")
def test_export_into_a_folder_that_cannot_be_written_is_one_line_before_the_work(work, capsys, no_data_loading):
    code, line = command(capsys, "export", str(work / "run"), "--to", "/proc/feddr_model.pt")
    assert code == 2 and "cannot write in /proc" in line, line
    assert not Path("/proc/feddr_model.pt").exists()


def test_export_onto_a_full_disk_is_exit_3_and_leaves_no_torn_file(work, capsys, monkeypatch):
    real_write = Path.write_bytes

    def fill_the_disk(path, data):
        if path.name.startswith(".model.pt"):
            real_write(path, data[:100])  # the part written before the disk filled up
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", fill_the_disk)
    code, line = command(capsys, "export", str(work / "run"), "--to", str(work / "out" / "model.pt"))
    monkeypatch.setattr(Path, "write_bytes", real_write)
    assert code == 3 and f"cannot write {work / 'out' / 'model.pt'} (No space left on device" in line, line
    assert files(work / "out") == []  # no model.pt, no model.json, no temporary file


def test_export_whose_description_cannot_be_written_takes_the_weights_back(work, capsys, monkeypatch):
    real_write = fk.rundir.write_text

    def fail_on_json(path, text):
        if path.suffix == ".json":
            raise fk.errors.StorageError(f"cannot write {path} (No space left on device)")
        real_write(path, text)

    monkeypatch.setattr(fk.rundir, "write_text", fail_on_json)
    code, line = command(capsys, "export", str(work / "run"), "--to", str(work / "out" / "model.pt"))
    assert code == 3 and "model.json" in line, line
    assert files(work / "out") == []


def test_export_of_a_run_with_a_truncated_checkpoint_is_one_line(work, capsys, no_data_loading):
    checkpoint = work / "run" / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    code, line = command(capsys, "export", str(work / "run"), "--to", str(work / "out" / "model.pt"))
    assert code == 2 and str(checkpoint) in line and "unreadable" in line, line
    assert not (work / "out").exists()  # the folder made for the export went again


# --------------------------------------------------------------------------- fk.load_model
def test_load_model_of_a_truncated_weights_file_is_one_line(work):
    weights = work / "model.pt"
    weights.write_bytes(weights.read_bytes()[:500])
    with pytest.raises(FeddrKitError, match=f"load_model: cannot read {weights}") as caught:
        fk.load_model(weights)
    assert "\n" not in str(caught.value)


def test_load_model_of_a_truncated_description_is_one_line(work):
    description = work / "model.json"
    description.write_text(description.read_text()[:40])
    with pytest.raises(FeddrKitError, match=f"load_model: cannot read {description}") as caught:
        fk.load_model(work / "model.pt")
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- show
def test_show_of_a_run_with_a_corrupt_summary_is_one_line(work, capsys):
    (work / "run" / "summary.json").write_text('{"final_acc": 0.2,')
    code, line = command(capsys, "show", str(work / "run"))
    assert code == 2 and f"cannot read {work / 'run' / 'summary.json'}" in line, line


def test_show_of_a_run_with_an_empty_history_is_one_line(work, capsys):
    (work / "run" / "history.csv").write_text("")
    code, line = command(capsys, "show", str(work / "run"))
    assert code == 2 and f"cannot read {work / 'run' / 'history.csv'}" in line, line
    assert not (work / "run" / "history.png").exists()


def test_show_of_a_sweep_with_its_csv_through_a_file_is_one_line_before_the_table(work, capsys, monkeypatch):
    root = work / "sweep"
    (root / "point").mkdir(parents=True)
    shutil.copy(work / "run" / "config.json", root / "point" / "config.json")
    (work / "afile").write_text("x")

    def refuse(*args, **kw):
        raise AssertionError("the table was computed before its destination was checked")

    monkeypatch.setattr(fk.sweep, "interval_summary", refuse)
    code, line = command(capsys, "show", str(root), "--csv", str(work / "afile" / "t.csv"))
    assert code == 2 and "--csv" in line and "is a file" in line, line


def test_show_onto_a_full_disk_is_exit_3_and_leaves_no_torn_plot(work, capsys, monkeypatch):
    def fill_the_disk(self, fname, *args, **kw):
        Path(fname).write_bytes(b"")  # the empty file a full disk leaves
        raise FULL_DISK

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fill_the_disk)
    code, line = command(capsys, "show", str(work / "run"))
    assert code == 3 and f"cannot write {work / 'run' / 'history.png'}" in line, line
    assert [p.name for p in (work / "run").iterdir() if "history.png" in p.name] == []


# --------------------------------------------------------------------------- personalize
@pytest.mark.parametrize("method", ["finetune", "local-only"])
def test_personalize_into_a_path_through_a_file_is_one_line_before_any_client_trains(work, capsys, monkeypatch,
                                                                                      method):
    (work / "afile").write_text("x")

    def refuse(*args, **kw):
        raise AssertionError("a client trained before the output folder was checked")

    monkeypatch.setattr(local, "train_client", refuse)
    code, line = command(capsys, "personalize", "--run", str(work / "run"), "--method", method, "--epochs", "1",
                         "--out", str(work / "afile" / "p"), "--no-progress")
    assert code == 2 and "--out" in line and "is a file" in line, line


def test_personalize_onto_a_full_disk_is_exit_3_and_leaves_neither_file(work, capsys, monkeypatch):
    real_write = fk.rundir.write_text

    def fail_on_summary(path, text):
        if path.name == "summary.json":
            raise fk.errors.StorageError(f"cannot write {path} (No space left on device)")
        real_write(path, text)

    monkeypatch.setattr(fk.rundir, "write_text", fail_on_summary)
    code, line = command(capsys, "personalize", "--run", str(work / "run"), "--epochs", "1", "--out",
                         str(work / "p"), "--no-progress")
    assert code == 3 and "summary.json" in line, line
    assert not (work / "p").exists()  # its table went, and the folder made for it
