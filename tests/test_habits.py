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
from feddr_kit import progress
from feddr_kit.__main__ import build_parser, command_config, main
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


# --------------------------------------------------------------------------- config files, resume
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_sets_fields_and_flags_typed_override_it(tmp_path, suffix):
    file = tmp_path / f"run{suffix}"
    values = {"dataset": "synthetic", "rounds": 7, "lr": 0.2, "lr_decay_at": [0.5]}
    file.write_text(json.dumps(values) if suffix == ".json" else
                    "dataset: synthetic\nrounds: 7\nlr: 0.2\nlr_decay_at: [0.5]\n")
    argv = ["run", "--config", str(file), "--rounds", "3"]
    cfg = command_config(vars(build_parser(typed_only=True).parse_args(argv)), str(file))
    assert (cfg.dataset, cfg.rounds, cfg.lr, cfg.lr_decay_at) == ("synthetic", 3, 0.2, (0.5,))
    assert cfg.local_epochs == fk.Config().local_epochs  # neither in the file nor typed: the default


def test_config_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: synthetic\nrouns: 3\n")
    with pytest.raises(FeddrKitError, match="unknown field.*rouns"):
        fk.Config.from_file(bad)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(FeddrKitError, match="mapping"):
        fk.Config.from_file(tmp_path / "list.json")
    (tmp_path / "x.toml").write_text("")
    with pytest.raises(FeddrKitError, match=r"\.json, \.yaml or \.yml"):
        fk.Config.from_file(tmp_path / "x.toml")


def test_a_runs_config_json_reruns_it(tmp_path, synthetic):
    fk.run(fk.Config(**SMALL, out_dir=str(tmp_path / "a")), data=synthetic)
    assert main(["run", "--config", str(tmp_path / "a" / "config.json"), "--out-dir", str(tmp_path / "b")]) == 0
    pd.testing.assert_frame_equal(history(tmp_path / "a"), history(tmp_path / "b"))


def test_resume_with_only_rounds_continues_a_run_started_with_ten_flags(tmp_path, capsys):
    started, whole = tmp_path / "started", tmp_path / "whole"
    assert main(["run", *TEN_FLAGS, "--rounds", "2", "--checkpoint-every", "1", "--out-dir", str(started)]) == 0
    assert main(["run", "--out-dir", str(started), "--resume", "--rounds", "4"]) == 0
    assert main(["run", *TEN_FLAGS, "--rounds", "4", "--out-dir", str(whole)]) == 0
    pd.testing.assert_frame_equal(history(started), history(whole))
    assert json.loads((started / "config.json").read_text())["rounds"] == 4


def test_a_refused_resume_lists_every_differing_field(tmp_path, capsys):
    folder = tmp_path / "run"
    assert main(["run", *TEN_FLAGS, "--rounds", "2", "--out-dir", str(folder)]) == 0
    capsys.readouterr()
    argv = ["run", "--out-dir", str(folder), "--resume", "--rounds", "3", "--seed", "4", "--batch-size", "10",
            "--momentum", "0.5"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for change in ("seed: 3 -> 4", "batch_size: 20 -> 10", "momentum: 0.9 -> 0.5"):
        assert change in err
    assert "rounds" not in err.split("only")[0]  # a change resume takes is not listed as refused
    assert main(["run", "--out-dir", str(tmp_path / "none"), "--resume"]) == 2
    assert "config.json does not exist" in capsys.readouterr().err


def test_sweep_takes_a_config_file_under_its_grid_and_flags_over_both(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("dataset: synthetic\nmodel: cnn\nnum_clients: 5\nclients_per_round: 2\n"
                                        "shards_per_client: 2\nrounds: 3\nlr_gamma: 1.0\nbatch_size: 20\n")
    (tmp_path / "grid.yaml").write_text("base: {rounds: 2, eval_every: 1}\ngrid: {algorithm: [fedavg]}\nseeds: [0]\n")
    argv = ["sweep", "--grid", str(tmp_path / "grid.yaml"), "--root", str(tmp_path / "root"),
            "--config", str(tmp_path / "base.yaml"), "--rounds", "1", "--no-progress", "--jobs", "1"]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "root" / "algorithm=fedavg__seed=0" / "config.json").read_text())
    assert (saved["dataset"], saved["batch_size"], saved["eval_every"], saved["rounds"]) == ("synthetic", 20, 1, 1)


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


def test_the_image_folder_decode_prints_progress_lines(tmp_path, monkeypatch, capsys):
    from PIL import Image

    for split, n in (("train", 3), ("test", 1)):
        for label in ("cat", "dog"):
            (tmp_path / "images" / split / label).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (8, 8), (40 * i, 80, 120)).save(tmp_path / "images" / split / label / f"{i}.png")
    monkeypatch.setenv("FEDDR_CACHE_DIR", str(tmp_path / "cache"))
    fk.data.load("imagefolder", path=tmp_path / "images")
    err = capsys.readouterr().err
    assert "decoding images (once; cached after): 0/8 images" in err and "8/8 images (100%)" in err


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


# --------------------------------------------------------------------------- show, sweep tables
def test_show_prints_a_runs_summary_and_plots_its_history(tmp_path, synthetic, capsys):
    fk.run(fk.Config(**SMALL, out_dir=str(tmp_path)), data=synthetic)
    capsys.readouterr()
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert f"{summary['final_acc']:.2%}" in out and "last5_acc" in out
    assert (tmp_path / "history.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_writes_its_tables_and_show_prints_the_intervals(tmp_path, synthetic, capsys):
    base = {k: v for k, v in SMALL.items() if k not in ("seed", "progress")}
    df = fk.sweep.run(base, {"algorithm": ["fedavg", "dr"]}, [0, 1], tmp_path, data=synthetic, progress=False)
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table.columns) == ["algorithm", "value", "mean", "low", "high", "half_width", "n"]
    assert list(table["algorithm"]) == ["fedavg", "dr"] and list(table["n"]) == [2, 2]
    fedavg = df[df["algorithm"] == "fedavg"]["final_acc"]
    assert table.loc[0, "mean"] == pytest.approx(fedavg.mean())
    assert len(pd.read_csv(tmp_path / "runs.csv")) == 4
    capsys.readouterr()
    assert main(["show", str(tmp_path), "--csv", str(tmp_path / "copy.csv")]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and f"{100 * fedavg.mean():.2f} ±" in out
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "copy.csv"), table)
    assert main(["show", str(tmp_path / "nothing")]) == 2


# --------------------------------------------------------------------------- export
def test_export_writes_weights_alone_and_load_model_rebuilds_the_net(tmp_path, synthetic, capsys):
    result = fk.run(fk.Config(**SMALL, out_dir=str(tmp_path / "run")), data=synthetic)
    assert main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "model.pt")]) == 0
    weights = torch.load(tmp_path / "model.pt", weights_only=True)  # no pickled code needed
    info = json.loads((tmp_path / "model.json").read_text())
    assert info["model"] == "cnn" and info["config"]["algorithm"] == "feddr+" and len(info["classes"]) == 10
    assert info["config"]["out_dir"] is None  # no path of the exporting machine travels with the file
    model = fk.load_model(tmp_path / "model.pt")
    assert isinstance(model, fk.models.Net) and set(weights) == set(model.state_dict())
    x = synthetic.normalize(synthetic.test_x[:20])
    result.model.eval()
    torch.testing.assert_close(model(x), result.model(x), rtol=0, atol=0)


def test_export_refusals_are_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--to", str(tmp_path / "m.onnx")]) == 2
    assert ".pt or .safetensors" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--to", str(tmp_path / "m.pt")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    try:
        import safetensors  # noqa: F401
    except ImportError:
        assert main(["export", str(tmp_path), "--to", str(tmp_path / "m.safetensors")]) == 2
        assert "pip install safetensors" in capsys.readouterr().err


# --------------------------------------------------------------------------- personalization
@pytest.mark.parametrize("method", ["finetune", "local-only"])
def test_personalize_command_saves_per_client_accuracies_with_progress(tmp_path, synthetic, capsys, method):
    fk.run(fk.Config(**SMALL, out_dir=str(tmp_path / "run")), data=synthetic)
    capsys.readouterr()
    assert main(["personalize", "--run", str(tmp_path / "run"), "--method", method, "--epochs", "1"]) == 0
    captured = capsys.readouterr()
    folder = tmp_path / "run" / f"personalize-{method}"
    per_client = pd.read_csv(folder / "per_client.csv")
    summary = json.loads((folder / "summary.json").read_text())
    assert list(per_client["client"]) == list(range(5))
    assert summary["after_mean"] == pytest.approx(per_client["after"].mean())
    assert "5/5 clients (100%)" in captured.err and f"{summary['after_mean']:.2%}" in captured.out


# --------------------------------------------------------------------------- Flower
def test_flower_help_names_only_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["flower", "--help"])
    text = capsys.readouterr().out
    assert "--probes" not in text and "--engine" not in text and "--resume" not in text
    assert "(default: None)" not in text and "(default: num_clients)" in text
    assert 'pip install -e ".[flower]"' in text


def test_flower_without_its_extra_says_how_to_get_it(tmp_path, capsys):
    from feddr_kit import flower

    try:
        flower.check_installed()
    except FeddrKitError:
        pass
    else:
        pytest.skip("Flower's simulation extra is installed here")
    assert main(["flower", "--dataset", "synthetic", "--out-dir", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install -e ".[flower]"' in err
    assert not (tmp_path / "f").exists()  # nothing started


def test_flower_refuses_a_used_folder_without_offering_resume(tmp_path, synthetic):
    from feddr_kit import flower

    fk.run(fk.Config(**SMALL, out_dir=str(tmp_path)), data=synthetic)
    with pytest.raises(FeddrKitError, match="overwrite") as err:
        flower.simulate(fk.Config(**SMALL, out_dir=str(tmp_path)))
    assert "--resume" not in str(err.value)


def test_the_flower_server_app_prints_accuracy_as_run_does(synthetic, capsys):
    pytest.importorskip("flwr")
    import re

    from flwr.app import Context, RecordDict

    from feddr_kit import flower

    cfg = fk.Config(**SMALL, engine="serial")
    flower.provide_data(cfg, synthetic)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=flower.config_to_run_config(cfg))
    flower.server_main(flower.InProcessGrid(flower.client_app, cfg), context)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("feddr_kit on Flower")][0]
    assert re.search(r"final accuracy \d+\.\d\d%, best \d+\.\d\d%", line), line


# --------------------------------------------------------------------------- documented outputs
def test_docs_name_every_file_and_column_a_run_writes(tmp_path, synthetic):
    text = (REPO / "docs" / "outputs.md").read_text()
    result = fk.run(fk.Config(**SMALL, probes=True, probe_samples=40, out_dir=str(tmp_path)), data=synthetic)
    for name in [*result.history.columns, *result.summary, *(p.name for p in tmp_path.iterdir())]:
        assert f"`{name}`" in text, f"docs/outputs.md does not name {name}"
    for name in ("point.json", "sweep.json", "runs.csv", "table.csv", "error.txt", "flower_timing.json",
                 "results.json", "per_client.csv", "history.png", "tb/"):
        assert f"`{name}`" in text, f"docs/outputs.md does not name {name}"
    assert "docs/outputs.md" in (REPO / "README.md").read_text()


def test_results_json_states_its_units(tmp_path):
    path = fk.teaching.save_results(tmp_path, {"final_acc": 0.5})
    units = json.loads(path.read_text())["units"]
    assert "fraction" in units["accuracy"] and "seconds" in units["seconds"]
