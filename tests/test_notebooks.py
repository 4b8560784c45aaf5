"""The chapter notebooks: stored in a clean, executed state, and chapter 03 runs under papermill.

nbval (``pytest --nbval-lax``, configured in pyproject.toml) re-executes every notebook with its
default parameters; these tests add what nbval does not check: the chapters' conventions
(parameters cell, kernelspec, clean outputs) and a parameterized papermill run that writes
``results.json``.
"""
from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import nbformat
import pytest

from feddr_kit.errors import FeddrKitError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
TRAINING = {"00_quickstart", "03_dr_forgets_unseen", "04_feature_distillation",
            "05_nine_algorithms", "06_regularizer_synergy", "07_sensitivity"}  # 05-07 train their live slice
ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")  # memory addresses in reprs
OBJECT_REPR = re.compile(r"<(Axes|Figure|matplotlib|mpl_toolkits)")  # a plotting call without its `;`
TIMING = re.compile(r"\d+(\.\d+)?\s*(it/s|s/it)|\d+:\d\d<")  # tqdm progress bars


def cifar10_available() -> bool:
    """True when $FEDDR_DATA_DIR (set by conftest.py) holds CIFAR-10."""
    root = Path(os.environ.get("FEDDR_DATA_DIR", NOTEBOOKS.parent / "data"))
    return (root / "cifar-10-batches-py").is_dir() or (root / "cifar10-jpeg").is_dir()


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _texts(cell):
    for out in cell.get("outputs", []):
        if "text" in out:
            yield out["text"]
        for key, value in out.get("data", {}).items():
            if key.startswith("text/"):
                yield value if isinstance(value, str) else "".join(value)


def test_chapters_exist():
    names = [p.stem for p in CHAPTERS]
    for stem in ("00_quickstart", "01_ce_pull_push", "02_simplex_etf", "03_dr_forgets_unseen",
                 "04_feature_distillation", "05_nine_algorithms", "06_regularizer_synergy", "07_sensitivity"):
        assert stem in names


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_kernelspec_is_the_one_jupyterlab_writes(path):
    """JupyterLab rewrites the kernelspec it finds to its own ("Python 3 (ipykernel)"), so a notebook stored
    with another display name opens with unsaved changes and asks to be saved on close."""
    spec = nbformat.read(path, as_version=4).metadata.kernelspec
    assert (spec.name, spec.display_name, spec.language) == ("python3", "Python 3 (ipykernel)", "python")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_notebook_conventions(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    cells = _code_cells(nb)
    params = cells[0]
    assert "parameters" in params.metadata.get("tags", []), "first code cell must be tagged 'parameters'"
    names = set()
    for stmt in ast.parse(params.source).body:  # literal assignments only
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name), \
            f"parameters cell: only `name = literal` lines, got {ast.unparse(stmt)!r}"
        ast.literal_eval(stmt.value)
        names.add(stmt.targets[0].id)
    assert "paper" in params.source.lower(), "parameters cell must give the paper-scale values in a comment"
    # `papermill --help-notebook` must list every parameter (its parser skips lines it cannot read,
    # e.g. a trailing comment holding "=" or "<")
    import papermill

    assert set(papermill.inspect_notebook(str(path))) == names
    if path.stem in TRAINING:  # the quickstart shows a progress bar (run_all.sh strips it); chapters keep quiet
        progress = "progress=True" if path.stem == "00_quickstart" else "progress=False"
        assert "out_dir" in names and progress in "".join(c.source for c in cells)
    for cell in cells:
        if "interact(" in cell.source:
            assert "nbval-ignore-output" in cell.metadata.get("tags", [])
    asserts = sum(isinstance(node, ast.Assert) for c in cells[1:] for node in ast.walk(ast.parse(c.source)))
    assert asserts >= (1 if path.stem == "00_quickstart" else 2), f"only {asserts} asserts pin the text's claims"
    figures = sum("image/png" in out.get("data", {}) for c in cells for out in c.get("outputs", []))
    assert figures >= 1, "the committed notebook must show its figures"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_stored_outputs_are_clean(path):
    """Committed executed with the defaults: no errors, no stderr, no memory addresses or object reprs
    (figures are shown as images; end plotting lines with `;`), no progress bars, no cell timings."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(_code_cells(nb)):
        assert cell.execution_count is not None or not cell.source.strip() or \
            "nbval-ignore-output" in cell.metadata.get("tags", []), f"code cell {i} was not executed"
        assert "execution" not in cell.metadata, f"code cell {i} stores timings"
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"code cell {i} stored an error: {out.get('ename')}"
            assert out.get("name") != "stderr", f"code cell {i} printed to stderr"
            if out.output_type == "execute_result":  # a cell's value: a table or a number, never an object repr
                plain = "".join(out.get("data", {}).get("text/plain", ""))
                assert not plain.lstrip("[(").startswith("<") and not OBJECT_REPR.search(plain), \
                    f"code cell {i} shows an object repr: {plain[:60]!r}"
        for text in _texts(cell):
            assert not ADDRESS.search(text), f"code cell {i} shows a memory address"
            assert not TIMING.search(text), f"code cell {i} shows a progress bar"


def _papermill_results(chapter: str, parameters: dict, tmp_path: Path) -> dict:
    """Execute ``notebooks/<chapter>.ipynb`` under papermill with ``parameters`` and an ``out_dir`` in
    ``tmp_path``; return the results.json it wrote."""
    import papermill

    out = tmp_path / "out"
    papermill.execute_notebook(
        str(NOTEBOOKS / f"{chapter}.ipynb"), str(tmp_path / f"{chapter}.ipynb"),
        parameters={**parameters, "out_dir": str(out)}, cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False,
    )
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR")
def test_chapter_03_under_papermill(tmp_path):
    """Slow (about 2 min on 2 CPU cores): chapter 03 with 2 rounds, one seed, one same-model draw and a small
    wipe-out table runs its seeds itself (the parameters differ from results/ch03_04_probes.json) and writes
    results.json."""
    # a constant lr: with the default schedule the only probed round (the last) would train at lr / 100
    results = _papermill_results("03_dr_forgets_unseen", {"rounds": 2, "lr_gamma": 1.0, "same_model_draws": 1, "probe_samples": 200,
                                                          "wipe_shards": [5], "wipe_lr_fractions": [1.0, 0.01],
                                                          "seeds": [0], "seed": 0}, tmp_path)
    assert results["config"]["parameters"]["rounds"] == 2 and results["config"]["seeds_from"] == "this run"
    assert set(results["config"]["runs"]) == {"CE (fedavg)", "DR (dr)"}
    runs = results["results"]["runs_mean_over_rounds"]
    for label in ("CE (fedavg)", "DR (dr)"):
        for key in ("align_obs", "align_unobs", "acc_obs", "acc_unobs", "align_gap_obs", "acc_gap_unobs"):
            assert isinstance(runs[label][key], float)
        assert 0.0 <= results["results"]["global_acc"][label]["final_acc"] <= 1.0
    for lrs in ("own lrs", "shared lr 0.1"):
        assert set(results["results"]["same_global_model"][lrs]) == {"CE, head trained", "CE, frozen ETF", "DR, frozen ETF"}
    assert set(results["results"]["wipe_out"]) == {"s=5, lr x 1", "s=5, lr x 0.01"}
    # one seed: every comparison is untestable, none is decided
    assert {c["verdict"] for c in results["results"]["claims"]} == {"untestable here"}


@pytest.mark.slow
@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR")
def test_chapter_04_under_papermill(tmp_path):
    """Slow (about 2 min on 2 CPU cores): chapter 04 with 2 rounds, one seed and a 3-value beta sweep (with its
    control arm) writes results.json."""
    results = _papermill_results("04_feature_distillation", {"rounds": 2, "beta_grid": [1.0, 0.5], "probe_samples": 200,
                                                             "seeds": [0], "seed": 0}, tmp_path)
    assert results["config"]["parameters"]["rounds"] == 2 and results["config"]["seeds_from"] == "this run"
    # the sweep always adds plain DR (1.0) and FedDr+'s beta (0.9) to the grid it is given; the control runs at every beta
    sweep = results["results"]["beta_sweep_one_round"]
    assert sorted(float(b) for b in sweep["FedDr+"]) == [0.5, 0.9, 1.0] == sorted(float(b) for b in sweep["DR lr×β"])
    assert set(results["config"]["runs"]) == {"DR (dr)", "FedDr+ (beta=0.9)", "DR lr×β (control)"}
    for label, acc in results["results"]["global_acc"].items():
        assert 0.0 <= acc["final_acc"] <= 1.0, label
    claims = {c["claim"]: c for c in results["results"]["claims"]}
    for vs in ("vs DR", "vs control"):
        assert claims[f"FedDr+'s global model more accurate (final round), {vs}"]["verdict"] == "untestable here"


# Each chapter's live slice cut to one run of one round: nbval already executes the default slice (every run of
# it, at the default smoke_rounds), so a larger one here would only train the same runs again.
ONE_RUN_SLICES = {"05_nine_algorithms": {"slice_algorithms": ["feddr+"]},
                  "06_regularizer_synergy": {"slice_regularizers": ["fd"]},
                  "07_sensitivity": {"slice_algorithms": ["feddr+"], "slice_local_epochs": [1]}}


@pytest.mark.slow
@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR")
@pytest.mark.parametrize("chapter", list(ONE_RUN_SLICES))
def test_results_chapters_under_papermill(chapter, tmp_path):
    """Slow (15-40 s each on 2 CPU cores): a results chapter with a one-run, 1-round live slice writes
    results.json with its claims (one verdict each) and the slice's run, whatever the state of its committed CSV."""
    results = _papermill_results(chapter, {"smoke_rounds": 1, **ONE_RUN_SLICES[chapter]}, tmp_path)
    parameters = results["config"]["parameters"]
    assert parameters["smoke_rounds"] == 1 and parameters["rerun"] is False
    assert all(parameters[k] == v for k, v in ONE_RUN_SLICES[chapter].items()), parameters
    body = results["results"]
    assert body["runs_finished"] <= body["runs_expected"]
    from feddr_kit.stats import VERDICTS

    assert body["claims"] and all(c["verdict"] in VERDICTS for c in body["claims"])
    assert len(body["slice"]) == 1 and all(0.0 <= r["final_acc"] <= 1.0 for r in body["slice"])
    assert (tmp_path / "out").is_dir() and any((tmp_path / "out").glob("slice_*/*/summary.json"))


def test_binder_requirements_match_the_pins():
    """binder/requirements.txt = requirements.txt's pins without `-e .` (postBuild installs the kit)."""
    def pins(path):
        lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
        return {ln for ln in lines if ln and not ln.startswith("-")}

    root = NOTEBOOKS.parent
    assert pins(root / "binder" / "requirements.txt") == pins(root / "requirements.txt")
    lines = [ln.split("#")[0].strip() for ln in (root / "binder" / "requirements.txt").read_text().splitlines()]
    assert "-e ." not in lines
    assert "pip install" in (root / "binder" / "postBuild").read_text()


# ----------------------------------------------------------------------------- the notebooks' helpers
def test_teaching_forces_split_and_dr_only_rotates():
    import torch

    from feddr_kit import teaching

    V = teaching.circle_head(3)
    pts = teaching.feature_grid(2.0, 6)  # even n: no point at the origin
    pull, push = teaching.ce_forces(pts, V, 1)
    h = pts.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(h @ V.T, torch.full((len(pts),), 1), reduction="sum")
    (grad,) = torch.autograd.grad(loss, h)
    assert torch.allclose(pull + push, -grad, atol=1e-12)
    dr = teaching.dr_force(pts, V, 1)
    assert (dr * pts).sum(1).abs().max() < 1e-12  # perpendicular to the feature
    moved = V.clone()
    moved[[0, 2]] = -moved[[0, 2]]
    assert torch.equal(teaching.dr_force(pts, moved, 1), dr)  # blind to the other classes
    traj = teaching.descent_trajectory([1.0, -0.5], V, 0, "dr", lr=0.3, steps=5)
    assert list(traj["step"]) == list(range(6)) and traj["cos_true"].iloc[-1] > traj["cos_true"].iloc[0]
    table = teaching.alignment_force_vs_norm(V, 0, 30.0, norms=(1.0, 8.0))
    assert table["ce"].iloc[1] < table["ce"].iloc[0]


def test_forces_at_matches_the_grid_forces_and_one_step():
    import math

    import torch

    from feddr_kit import teaching
    from feddr_kit.errors import FeddrKitError

    V = teaching.circle_head(5)
    f = teaching.forces_at(200.0, 2.5, V, y=1, lr=0.3)
    h = 2.5 * torch.tensor([[math.cos(math.radians(200.0)), math.sin(math.radians(200.0))]], dtype=torch.float64)
    pull, push = teaching.ce_forces(h, V, 1)
    assert torch.allclose(f["h"], h[0]) and torch.allclose(f["ce"], (pull + push)[0])
    assert torch.allclose(f["h_dr"], h[0] + 0.3 * teaching.dr_force(h, V, 1)[0])
    assert abs(f["p_y"] - float(torch.softmax(h @ V.T, 1)[0, 1])) < 1e-12
    with pytest.raises(FeddrKitError, match="norm"):
        teaching.forces_at(0.0, 0.0, V)


def test_alignment_race_names_the_loss_that_ends_better_aligned():
    from feddr_kit import teaching

    V = teaching.circle_head(3)
    race = teaching.alignment_race(V, 0, {"a": 120.0, "b": -30.0}, norms=(1.0, 10.0), lrs=(0.5,), steps=5)
    assert len(race) == 2 * 2 and set(race["start"]) == {"a", "b"}
    for _, row in race.iterrows():
        end = {loss: teaching.descent_trajectory([row["norm"] * c for c in
                                                  ((-0.5, 3 ** 0.5 / 2) if row["start"] == "a" else (3 ** 0.5 / 2, -0.5))],
                                                 V, 0, loss, lr=0.5, steps=5)["cos_true"].iloc[-1] for loss in ("ce", "dr")}
        assert abs(row["ce"] - end["ce"]) < 1e-9 and abs(row["dr"] - end["dr"]) < 1e-9
        assert row["faster"] == max(end, key=end.get)


def test_teaching_head_tables():
    from feddr_kit import heads, teaching

    assert teaching.etf_checks(heads.simplex_etf(5, 4))["angle_err"] < 1e-6
    assert teaching.claim("a < b", 1.0, 2.0)["held"] and not teaching.claim("a < b", 2.0, 2.0)["held"]
    t = teaching.head_cosine_table((3, 6), dim=8)
    assert set(t["head"]) == {"simplex ETF", "random orthonormal", "random init"}
    assert len(t) == 3 * (3 + 15)


def _synthetic_etf_model():
    """4-class synthetic data, a 4-client shard partition and a cnn whose head is the simplex ETF (seed 0)."""
    import torch

    import feddr_kit as fk

    data = fk.data.load("synthetic", num_classes=4, train_per_class=40, test_per_class=10)
    part = fk.partition.shard(data.train_y, data.test_y, num_clients=4, shards_per_client=2, seed=0)
    torch.manual_seed(0)
    model = fk.models.build_model("cnn", 4)
    with torch.no_grad():
        model.head.weight.copy_(fk.heads.simplex_etf(4, model.feature_dim))
    return data, part, model


def test_local_round_probes_on_synthetic_data(tmp_path):
    import torch

    import feddr_kit as fk
    from feddr_kit import teaching

    data, part, model = _synthetic_etf_model()
    etf = model.head.weight.detach().clone()
    df = teaching.local_round_probes(model, data, part, {"CE": "fedbabu", "DR": "dr", "Dr+": "feddr+"},
                                     clients=[0, 1], local_epochs=1, probe_samples=40)
    assert list(df["run"]) == ["CE", "CE", "DR", "DR", "Dr+", "Dr+"]
    assert set(fk.probes.PROBE_COLUMNS) <= set(df.columns)
    assert torch.equal(model.head.weight, etf)  # the shared global model is left untouched
    table = teaching.with_gaps(df).groupby("run")[["align_gap_obs", "feat_dist_obs"]].mean()
    assert table.notna().all().all()
    # Dirichlet clients take the loop's i.i.d. batches (not zero steps), and SCAFFOLD's gradient hook runs.
    dpart = fk.partition.dirichlet(data.train_y, data.test_y, num_clients=4, alpha=0.3, seed=0)
    df = teaching.local_round_probes(model, data, dpart, ["scaffold", "dr"], clients=[0], local_epochs=1,
                                     probe_samples=40)
    assert (df["feat_dist_obs"] > 0).all()
    with pytest.raises(FeddrKitError, match="architecture"):
        teaching.local_round_probes(model, data, part, ["fedetf"], clients=[0], local_epochs=1, probe_samples=40)
    path = teaching.save_results(tmp_path, {"x": float("nan")}, {"a": 1})
    assert json.loads(path.read_text()) == {"results": {"x": None}, "config": {"a": 1}, "units": teaching.RESULT_UNITS}


def test_local_round_probes_train_a_frozen_global_model():
    """A model from fk.load_model comes with requires_grad off; the local round must still train its body
    (identical to starting from the same weights with gradients on), and leave the given model as it was."""
    from feddr_kit import teaching

    data, part, model = _synthetic_etf_model()
    live = teaching.local_round_probes(model, data, part, {"DR": "dr"}, clients=[0], local_epochs=1, probe_samples=40)
    model.requires_grad_(False)
    frozen = teaching.local_round_probes(model, data, part, {"DR": "dr"}, clients=[0], local_epochs=1, probe_samples=40)
    assert (frozen["feat_dist_obs"] > 0).all()
    assert frozen["feat_dist_obs"].tolist() == live["feat_dist_obs"].tolist()
    assert not any(p.requires_grad for p in model.parameters())


# ----------------------------------------------------------------------------- chapters 03/04 over seeds
def test_paired_and_paired_claim_against_a_hand_computed_t_interval():
    import math

    import pandas as pd
    from scipy import stats as st

    from feddr_kit import stats, teaching

    table = pd.DataFrame({"run": ["A"] * 3 + ["B"] * 3, "seed": [0, 1, 2, 2, 1, 0],
                          "x": [1.0, 2.0, 3.0, 2.0, 1.5, 0.5], "zero": 0.0})
    d = teaching.paired(table, "x", "A", "B")  # per-seed differences 0.5, 0.5, 1.0 (B's rows are in another order)
    half = st.t.ppf(0.975, 2) * math.sqrt(((0.5 - 2 / 3) ** 2 * 2 + (1 / 3) ** 2) / 2) / math.sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(2 / 3) and d.low == pytest.approx(2 / 3 - half)
    c = teaching.paired_claim("A above B", "paper", "toy", table, "x", "A", "B", "greater", margin=0.0)
    assert c.verdict == stats.TIE and c.row()["seeds"] == "seeds 0, 1, 2"  # 2/3 - 0.717 < 0
    c = teaching.paired_claim("A above B", "paper", "toy", table, "x", "B", "A", "greater")
    assert c.verdict == stats.TIE
    pinned = teaching.paired_claim("A's zero below B's", "chapter hypothesis", "toy", table, "zero", "A", "B", "less")
    assert pinned.verdict == stats.UNTESTABLE
    clients = table.rename(columns={"seed": "client"})
    boot = teaching.paired(clients, "x", "A", "B", by="client")
    assert boot.method.startswith("bootstrap") and boot.low <= 2 / 3 <= boot.high
    with pytest.raises(FeddrKitError, match="run='C'"):
        teaching.paired(table, "x", "A", "C")


def test_per_seed_averages_rounds_and_adds_relative_distance():
    import pandas as pd

    from feddr_kit import teaching

    cols = {f"{q}_{s}": 1.0 for q in ("align", "global_align", "acc", "global_acc") for s in ("obs", "unobs")}
    h = pd.DataFrame([{"run": "A", "seed": 0, "round": r, **cols, "feat_dist_obs": 2.0 * r, "feat_dist_unobs": 1.0,
                       "global_feat_norm_obs": 4.0, "global_feat_norm_unobs": 2.0} for r in (1, 2, 3)])
    ps = teaching.per_seed(h)
    assert ps.loc[0, "feat_dist_obs"] == pytest.approx(4.0) and ps.loc[0, "feat_dist_rel_obs"] == pytest.approx(1.0)
    assert ps.loc[0, "feat_dist_rel_unobs"] == pytest.approx(0.5)
    assert teaching.per_seed(h, skip_rounds=2).loc[0, "feat_dist_obs"] == pytest.approx(6.0)
    with pytest.raises(FeddrKitError, match="skip_rounds"):
        teaching.per_seed(h, skip_rounds=3)


def test_client_classes_agrees_with_local_round_probes():
    import numpy as np

    import feddr_kit as fk
    from feddr_kit import teaching

    data, part, model = _synthetic_etf_model()
    losses = {"CE": "fedbabu", "DR": "dr"}
    per_class = teaching.client_classes(model, data, part, 1, losses, local_epochs=1, probe_samples=40)
    summary = teaching.local_round_probes(model, data, part, losses, clients=[1], local_epochs=1, probe_samples=40)
    observed = part.counts("train")[1] > 0
    assert len(per_class) == 2 * 4 and list(per_class["observed"][:4]) == list(observed)
    for run in losses:  # the probe set is class-balanced: the mean of per-class means is the overall mean
        t, s = per_class[per_class["run"] == run], summary[summary["run"] == run].iloc[0]
        for q in ("align", "acc", "global_align", "global_acc"):
            assert t.loc[t["observed"], q].mean() == pytest.approx(s[f"{q}_obs"], abs=1e-6), (run, q)
            assert t.loc[~t["observed"], q].mean() == pytest.approx(s[f"{q}_unobs"], abs=1e-6), (run, q)
    with pytest.raises(FeddrKitError, match="client"):
        teaching.client_classes(model, data, part, 4, losses)
    axes = fk.plots.client_drilldown(per_class, classes=data.classes, reference=-1 / 3)
    assert len(axes) == 2 and np.isclose(axes[0].lines[-1].get_ydata()[0], -1 / 3)


def test_seed_runs_reuse_and_the_one_seed_studies():
    import math

    import matplotlib.pyplot as plt

    import feddr_kit as fk
    from feddr_kit import teaching

    data = fk.data.load("synthetic", num_classes=4, train_per_class=40, test_per_class=10)
    cfg = fk.Config(dataset="synthetic", num_clients=4, clients_per_round=2, shards_per_client=2, rounds=1,
                    local_epochs=1, probes=True, probe_samples=40, eval_every=1, progress=False)
    first, res = teaching.seed_runs(cfg, {"DR": "dr"}, [0], data)
    hist, both = teaching.seed_runs(cfg, {"DR": "dr", "Dr+": "feddr+"}, [0, 1], data, reuse=res)
    assert both[("DR", 0)] is res[("DR", 0)] and len(both) == 4
    assert list(hist.columns[:3]) == ["run", "algorithm", "seed"] and len(hist) == 4
    same = teaching.same_model_study(both[("DR", 1)], {"CE": "fedbabu", "DR": "dr"}, lrs=[None, 0.01], draws=2,
                                     local_epochs=1, probe_samples=40)
    assert len(same) == 2 * 2 * 2 * 2  # lrs x draws x losses x clients
    assert set(same["seed"]) == {1} and set(same["draw"]) == {0, 1}
    assert math.isnan(same["lr"].iloc[0]) and set(same["lr"].dropna()) == {0.01}
    sweep = teaching.beta_sweep(both[("Dr+", 0)], [0.0, 1.0], local_epochs=1, probe_samples=40)
    assert sorted(set(sweep["beta"])) == [0.0, 1.0] and len(sweep) == 2 * 2
    axes = fk.plots.probe_panels({"DR": hist[hist["run"] == "DR"]}, ("align", "feat_dist_rel"),
                                 references={"align": -1 / 3})
    fig = axes[0].figure
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1  # one legend, under the panels
    plt.close("all")


def test_probe_y_labels_fit_their_panels_and_titles_keep_the_formulas():
    """Every probe quantity, three panels in a row under one two-row legend (chapter 04's feature figure): each
    y label is no taller than its axes and stays below the panel's title; the title keeps the full label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    import feddr_kit as fk
    from feddr_kit import plots

    fk.plots.use_style()
    base = [q for q in plots._PROBE_LABELS if q not in ("align_gap", "acc_gap", "feat_dist_rel")]  # with_gaps adds those
    rng = np.random.default_rng(0)
    hist = pd.DataFrame({"round": range(1, 7), **{f"{q}_{s}": rng.uniform(0.1, 1.0, 6) for q in base for s in ("obs", "unobs")}})
    histories = {name: hist for name in ("DR", "FedDr+", "control")}  # three runs: a legend of two rows
    quantities = list(plots._PROBE_LABELS)
    for k in range(0, len(quantities), 3):
        axes = fk.plots.probe_panels(histories, quantities[k:k + 3], suptitle="a figure title")
        fig = axes[0].figure
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax, q in zip(axes, quantities[k:k + 3]):
            label, box = ax.yaxis.label.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert label.height <= box.height and label.y1 <= ax.title.get_window_extent(renderer).y0, q
            assert ax.get_title() == plots._PROBE_LABELS[q]
        plt.close(fig)
