"""The paper-scale recipe (results/paper_scale.py) and its GPU lease script, on CPU at tiny sizes.

The recipe starts only what fits its budget, in priority order, and a second call continues where the
first stopped; its page is generated from the runs on disk. The lease script unpacks the carried CIFAR-10
byte for byte and runs without the kit's extra dependencies (a lent GPU has torch, torchvision, pandas,
tqdm and matplotlib only).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "results"))
import paper_scale  # noqa: E402

NPZ = Path(os.environ["FEDDR_DATA_DIR"]) / "cifar10-jpeg-bytes.npz"
pytestmark = pytest.mark.usefixtures("one_thread")


def unit(group, seed, *seconds):
    return paper_scale.Unit(group, seed, list(seconds))


def fk_config(group, seed):
    """The config of ``group``'s first cell at ``seed``."""
    return group.folders(Path("unused"), paper_scale.PAPER_SCALE, seed)[0][1]


def test_plan_starts_the_priority_prefix_that_fits():
    units = [unit(0, 0, 100, 100), unit(0, 1, 100, 100), unit(1, 0, 50), unit(2, 0, 10)]
    # one at a time: 200 s per unit of two runs
    assert paper_scale.plan(units, 450, jobs=1) == units[:3]
    assert paper_scale.plan(units, 449, jobs=1) == units[:2]
    assert paper_scale.plan(units, 250, jobs=1) == units[:1]  # the 50 s unit fits what is left, but may not jump
    assert paper_scale.plan(units, 199, jobs=1) == []
    # three side by side: group 0's four runs are one call, two waves of 100 s × the measured slowdown of three
    three = paper_scale.SIDE_BY_SIDE[3]
    assert paper_scale.plan_seconds(units[:2], jobs=3) == pytest.approx(2 * 100 * three)
    assert paper_scale.plan(units, 2 * 100 * three + 50, jobs=3) == units[:3]
    # two side by side was never measured: assumed to gain nothing
    assert paper_scale.plan_seconds(units[:1], jobs=2) == pytest.approx(200)


def test_the_plan_follows_the_issue_priorities():
    got = [(g.setting, list(g.cells.values())) for g in paper_scale.groups(paper_scale.PAPER_SCALE)]
    control_lr = 0.35 * 0.9  # FedDr+'s VGG-11 lr times beta, as fk.federated.beta_scaled_dr makes it
    assert got == [("s=2", ["fedavg", "feddr+"]), ("s=2", [0.35, pytest.approx(control_lr)]),
                   ("s=2", ["fedetf", "spherefed", "scaffold"]), ("s=5", ["fedavg", "feddr+"]),
                   ("α=0.1", ["fedavg", "feddr+"])]
    cfg = fk_config(paper_scale.groups(paper_scale.PAPER_SCALE)[0], seed=2)
    assert (cfg.model, cfg.num_clients, cfg.clients_per_round, cfg.rounds, cfg.local_epochs, cfg.dataset) == \
        ("vgg11", 100, 10, 320, 10, "cifar10")


def test_tiny_recipe_runs_what_fits_and_the_next_call_continues(tmp_path):
    root, export = tmp_path / "runs", tmp_path / "export"
    # 100 s a round (not measured: given) makes a tiny run 220 s and a unit of two 440 s, so 800 s holds one unit
    argv = ["--tiny", "--root", str(root), "--export", str(export), "--seeds", "0", "1", "--sec-per-round", "100",
            "--budget", "800"]
    first = paper_scale.main(argv)
    assert [(u.group, u.seed) for u in first] == [(0, 0)]
    done = sorted(p.relative_to(root).as_posix() for p in paper_scale.finished(root))
    assert done == ["s=2/fedavg_feddr+/algorithm=fedavg__seed=0", "s=2/fedavg_feddr+/algorithm=feddr+__seed=0"]
    for run in done:  # carried out without the checkpoint, which stays with the runs
        assert (export / run / "summary.json").exists() and not (export / run / "checkpoint.pt").exists()
        assert (root / run / "checkpoint.pt").exists()
    assert sorted(json.loads((export / "machines.json").read_text())) == done
    assert pd.read_csv(export / "paper_scale.csv")["run"].tolist() == done

    second = paper_scale.main(argv)  # the next lease: the next unit, seed 1
    assert [(u.group, u.seed) for u in second] == [(0, 1)]
    assert paper_scale.main([*argv[:-1], "100"]) == []  # nothing fits: nothing starts

    assert paper_scale.main(["--tiny", "--root", str(root), "--collect-only", "--doc", str(tmp_path / "page.md")]) == []
    page = (tmp_path / "page.md").read_text()
    assert "**4 of 33 planned runs have finished**" in page
    assert "| s=2 | FedDr+ |" in page and "(n=2)" in page and "| s=2 | DR | not run |" in page
    assert "paired over seeds [0, 1] (n=2)" in page  # FedDr+ against FedAvg
    assert "no seed has both FedDr+ and DR at lr·β (control)" in page


def test_the_page_is_generated_from_the_runs_on_disk():
    rows = paper_scale.rows(paper_scale.ROOT, paper_scale.PAPER_SCALE)
    assert paper_scale.DOC.read_text() == paper_scale.render_doc(rows, paper_scale.PAPER_SCALE), \
        "docs/paper_scale.md is stale: run python results/paper_scale.py --collect-only"
    if rows.empty:
        assert "No paper-scale run has been made yet" in paper_scale.DOC.read_text()


@pytest.mark.skipif(not NPZ.is_file(), reason="needs the packed CIFAR-10 (cifar10-jpeg-bytes.npz) in FEDDR_DATA_DIR")
def test_lease_script_runs_on_a_bare_gpu_machines_packages(tmp_path):
    """The lease script at tiny size with the kit's other dependencies made unimportable: it unpacks a slice of the
    npz byte for byte, logs every timing it has no time for as skipped, hands the rest to the recipe and ends."""
    missing = ["scipy", "seaborn", "yaml", "papermill", "flwr", "IPython", "ipywidgets", "nbformat", "safetensors",
               "tensorboard", "hypothesis", "pytest"]
    code = (f"import runpy, sys\nsys.modules.update(dict.fromkeys({missing!r}))\n"
            f"sys.argv = ['paper_scale_lease.py'] + sys.argv[1:]\n"
            f"runpy.run_path({str(REPO / 'benchmarks' / 'paper_scale_lease.py')!r}, run_name='__main__')")
    out, data = tmp_path / "out", tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, "--tiny", "--out", str(out), "--npz", str(NPZ), "--data-dir", str(data),
                    "--budget", "20", "--timing-seconds", "0"], check=True, env=env, capture_output=True, text=True,
                   timeout=300)
    table = pd.read_csv(out / "lease_times.csv")
    kinds = table["kind"].tolist()
    assert kinds[0] == "start" and kinds[1] == "data" and kinds[-2:] == ["recipe", "done"]
    assert set(kinds[2:-2]) == {"skipped", "choice"}
    written = sorted(p for p in (data / "cifar10-jpeg").rglob("*.jpg"))
    assert len(written) == 120  # every 500th of 50,000 + 10,000
    shared = Path(os.environ["FEDDR_DATA_DIR"]) / "cifar10-jpeg"
    for p in written[::10]:
        assert p.read_bytes() == (shared / p.relative_to(data / "cifar10-jpeg")).read_bytes()


def test_busy_seconds_counts_overlapping_device_events_once():
    import types

    sys.path.insert(0, str(REPO / "benchmarks"))
    import paper_scale_lease
    import torch

    def event(start, end, device="CUDA"):
        return types.SimpleNamespace(time_range=types.SimpleNamespace(start=start, end=end),
                                     device_type=getattr(torch.autograd.DeviceType, device))

    events = [event(0, 10), event(5, 20), event(6, 8), event(30, 40), event(0, 100, "CPU")]  # µs
    assert paper_scale_lease.busy_seconds(events) == pytest.approx(30e-6)
