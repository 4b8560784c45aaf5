"""The habits of the field: config files and a resume that reads the run's own config, results shown
and exported without code, progress that reads in a log, TensorBoard, personalization from the command
line, the Flower command's refusals, and documented output files. Small synthetic runs throughout."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit import progress, tblog
from feddr_kit.errors import FeddrKitError

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]

# Ten flags: what a researcher types to start a run, and must not retype to resume it.
TEN_FLAGS = ["--dataset", "synthetic", "--model", "cnn", "--num-clients", "5", "--clients-per-round", "2",
             "--shards-per-client", "2", "--eval-every", "1", "--batch-size", "20", "--lr", "0.05", "--seed", "3",
             "--lr-gamma", "1"]
SMALL = dict(dataset="synthetic", model="cnn", num_clients=5, clients_per_round=2, shards_per_client=2, eval_every=1,
             batch_size=20, lr=0.05, seed=3, lr_gamma=1.0, rounds=2, progress=False)


def history(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "history.csv").drop(columns="seconds")


@pytest.fixture(autouse=True)
def lines(monkeypatch):
    """Progress as plain lines, whatever runs the tests."""
    monkeypatch.setenv("FEDDR_PROGRESS", "lines")


# --------------------------------------------------------------------------- progress
def test_progress_lines_start_and_end_and_carry_the_accuracy(synthetic, capsys):
    fk.run(fk.Config(**{**SMALL, "progress": True}), data=synthetic)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("feddr+: 0/2 rounds (0%)")
    assert err[-1].startswith("feddr+: 2/2 rounds (100%)") and "test_acc=" in err[-1]
    assert not any("\r" in line for line in err)


def test_progress_kind_follows_the_place(monkeypatch):
    monkeypatch.setenv("FEDDR_PROGRESS", "bars")
    assert progress.kind() == "bars"
    monkeypatch.delenv("FEDDR_PROGRESS")
    assert progress.kind() == "lines"  # pytest's captured stderr is no terminal
    assert isinstance(progress.bar(3, "x"), progress.Lines)


def test_fine_tuning_and_sweeps_print_progress_lines(tmp_path, synthetic, capsys):
    result = fk.run(fk.Config(**SMALL), data=synthetic)
    fk.personalize.finetune(result, epochs=1, progress=True)
    err = capsys.readouterr().err
    assert "feddr+-FT: 0/5 clients" in err and "feddr+-FT: 5/5 clients (100%)" in err
    fk.sweep.run({k: v for k, v in SMALL.items() if k not in ("seed", "progress")}, {"algorithm": ["fedavg"]}, [0],
                 tmp_path, data=synthetic)
    err = capsys.readouterr().err
    assert "sweep: 0/1 runs" in err and "sweep: 1/1 runs (100%)" in err


def test_papermill_shows_progress_lines_in_the_terminal(tmp_path, monkeypatch):
    """A notebook executed by papermill prints plain progress lines (no widget), which
    ``papermill --log-output`` copies to the terminal."""
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.delenv("FEDDR_PROGRESS")  # the kernel must find out by itself that papermill runs it
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import feddr_kit as fk\n"
        f"fk.run(fk.Config(**{dict(SMALL, progress=True)!r}))")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    done = subprocess.run([sys.executable, "-m", "papermill", "--log-output", "--no-progress-bar",
                           str(tmp_path / "tiny.ipynb"), str(tmp_path / "out.ipynb"), "--cwd", str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "feddr+: 2/2 rounds (100%)" in done.stdout + done.stderr
    outputs = nbformat.read(tmp_path / "out.ipynb", 4).cells[0].outputs
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


# --------------------------------------------------------------------------- TensorBoard
def test_tensorboard_logs_every_evaluated_row(tmp_path, synthetic, monkeypatch):
    """Whatever is installed: each history row goes to the writer as scalars at its round."""
    written = []

    class Writer:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_text(self, tag, text):
            written.append(("text", tag, text))

        def add_scalar(self, tag, value, global_step):
            written.append((tag, value, global_step))

        def flush(self):
            pass

        def close(self):
            written.append("closed")

    module = type(sys)("torch.utils.tensorboard")
    module.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    result = fk.run(fk.Config(**SMALL, tensorboard=True, out_dir=str(tmp_path)), data=synthetic)
    assert written[0][:2] == ("text", "config") and '"tensorboard": true' in written[0][2]
    logged = {(tag, step): value for tag, value, step in (w for w in written[1:-1])}
    for _, row in result.history.iterrows():
        assert logged[("test_acc", int(row["round"]))] == pytest.approx(row["test_acc"])
        assert logged[("train_loss", int(row["round"]))] == pytest.approx(row["train_loss"])
    assert written[-1] == "closed"


def test_tensorboard_event_file_holds_the_runs_scalars(tmp_path, synthetic):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = fk.run(fk.Config(**SMALL, tensorboard=True, out_dir=str(tmp_path)), data=synthetic)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("test_acc")]
    assert steps == list(result.history["round"])
    assert [e.value for e in events.Scalars("test_acc")] == pytest.approx(list(result.history["test_acc"]))


def test_tensorboard_refusals_are_one_line_before_anything_loads(tmp_path):
    with pytest.raises(FeddrKitError, match="needs out_dir"):
        fk.run(fk.Config(**SMALL, tensorboard=True))
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(FeddrKitError, match="pip install tensorboard"):
            fk.run(fk.Config(**SMALL, tensorboard=True, out_dir=str(tmp_path / "tb_run")))
        assert not (tmp_path / "tb_run").exists()
