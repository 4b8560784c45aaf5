"""The kit on Flower (feddr_kit/flower/): the same code path as fk.run, bit for bit.

The fast tests call the ClientApp (``app(message, context)``) and the strategy directly, in this
process (no Ray, no SuperLink), through :class:`feddr_kit.flower.InProcessGrid`; they need plain
``flwr``. The real ``flwr run`` simulation is slow (Ray start-up) and runs only where
``flwr[simulation]`` is installed and ``FEDDR_FLOWER_SIMULATION=1`` asks for it. The deployment, with a real
SuperLink and SuperNodes, is tests/test_flower_deployment.py.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("flwr")
try:
    import tomllib
except ImportError:  # Python 3.10: flwr brings tomli
    import tomli as tomllib

import feddr_kit as fk  # noqa: E402
from feddr_kit import flower  # noqa: E402
from feddr_kit.errors import FeddrKitError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
# 4 clients, 3 sampled per round, 2 rounds: some clients train twice (SCAFFOLD's c_i comes back).
TINY = dict(dataset="synthetic", num_clients=4, clients_per_round=3, shards_per_client=5, rounds=2,
            local_epochs=1, eval_every=1, lr_gamma=1.0, progress=False, engine="serial", device="cpu")


def assert_same_run(a: fk.Result, b: fk.Result) -> None:
    """Histories equal but for wall-clock seconds, every weight bit-for-bit equal."""
    pd.testing.assert_frame_equal(a.history.drop(columns="seconds"), b.history.drop(columns="seconds"),
                                  check_exact=True)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("algorithm", ["fedavg", "feddr+", "scaffold", "fedexp"])
def test_flower_apps_equal_fk_run_bit_for_bit(synthetic, algorithm):
    cfg = fk.Config(algorithm=algorithm, **TINY)
    kit = fk.run(cfg, data=synthetic)
    on_flower = flower.run_in_process(cfg, data=synthetic)
    assert_same_run(kit, on_flower)
    assert kit.history["test_acc"].iloc[-1] > 0.0  # it trained: not two runs of nothing


def test_flower_run_writes_the_files_fk_run_writes(synthetic, tmp_path):
    """config.json (the regularizer recorded as the one used, not None), history.csv and summary.json
    equal fk.run's, but for the folder and the wall-clock times."""
    cfg = fk.Config(algorithm="feddr+", **TINY)
    assert cfg.regularizer is None  # each run decides it: feddr+'s own
    kit, on_flower = tmp_path / "kit", tmp_path / "flower"
    fk.run(cfg.replace(out_dir=str(kit)), data=synthetic)
    flower.run_in_process(cfg.replace(out_dir=str(on_flower)), data=synthetic)

    def read(folder: Path, name: str) -> dict:
        return json.loads((folder / name).read_text())

    config = {run: read(run, "config.json") for run in (kit, on_flower)}
    assert {run: c.pop("out_dir") for run, c in config.items()} == {kit: str(kit), on_flower: str(on_flower)}
    assert config[on_flower] == config[kit]
    assert config[kit]["regularizer"] == fk.algorithms.ALGORITHMS["feddr+"].default_regularizer
    timings = ("sec_per_round", "total_seconds")
    summary = {run: {k: v for k, v in read(run, "summary.json").items() if k not in timings} for run in (kit, on_flower)}
    assert summary[on_flower] == summary[kit]
    assert summary[kit]["regularizer"] == config[kit]["regularizer"]
    pd.testing.assert_frame_equal(pd.read_csv(on_flower / "history.csv").drop(columns="seconds"),
                                  pd.read_csv(kit / "history.csv").drop(columns="seconds"), check_exact=True)


def test_scaffold_client_state_lives_in_the_clients_context(synthetic):
    cfg = fk.Config(algorithm="scaffold", **TINY)
    kit = fk.run(cfg, data=synthetic)
    flower.provide_data(cfg, synthetic)
    grid = flower.InProcessGrid(flower.client_app, cfg)
    flower.run_on_grid(grid, cfg, data=synthetic)
    trained = {int(k) for t in range(cfg.rounds) for k in fk.federated.sample_clients(cfg.seed, t, 4, 3)}
    for ctx in grid.contexts.values():
        k = ctx.node_config[flower.PARTITION_ID]
        held = flower.from_record(ctx.state[flower.CLIENT_STATE], torch.device("cpu")) \
            if flower.CLIENT_STATE in ctx.state else {}
        if k not in trained:
            assert held == {}
            continue
        expected = kit.algorithm.c_clients[k]
        assert set(held) == set(expected)
        for n in expected:
            assert torch.equal(held[n], expected[n]), (k, n)


def test_sampling_uses_partition_ids_not_node_ids(synthetic):
    cfg = fk.Config(algorithm="fedavg", **TINY)
    flower.provide_data(cfg, synthetic)
    grid = flower.InProcessGrid(flower.client_app, cfg, first_node_id=500)
    setup = fk.federated.prepare(cfg, torch.device("cpu"), synthetic)
    strategy = flower.KitStrategy(setup)
    nodes = strategy.discover(grid)
    assert nodes == {p: 500 + 3 - p for p in range(4)}  # the grid numbers nodes in reverse
    messages = strategy.configure_train(1, flower.to_record(setup.initial_state), None, grid)
    sent_to = [m.metadata.dst_node_id for m in messages]
    sampled = fk.federated.sample_clients(cfg.seed, 0, 4, 3).tolist()
    assert sent_to == [500 + 3 - k for k in sampled]
    assert [int(m.content["config"]["client"]) for m in messages] == sampled


def test_clients_train_in_the_layout_the_server_records(synthetic):
    """The server decides the run's layout (``channels_last`` auto: its own device's) and records it; a client
    resolving auto on its own device (a GPU node beside a CPU server) would train in another. Here the
    clients' run config says auto (channels-last on this CPU) while the server runs NCHW: they follow the
    server, so the run equals fk.run's NCHW run bit for bit."""
    cfg = fk.Config(algorithm="feddr+", **{**TINY, "channels_last": False})
    flower.provide_data(cfg, synthetic)
    grid = flower.InProcessGrid(flower.client_app, cfg.replace(channels_last=None))
    assert fk.engine.resolve_layout(None, "serial", torch.device("cpu"))  # auto would pick channels-last here
    assert_same_run(fk.run(cfg, data=synthetic), flower.run_on_grid(grid, cfg, data=synthetic))


def test_a_missing_partition_is_a_clear_error(synthetic):
    cfg = fk.Config(algorithm="fedavg", **TINY)
    grid = flower.InProcessGrid(flower.client_app, cfg)
    grid.contexts.pop(next(iter(grid.contexts)))  # three nodes for four clients
    setup = fk.federated.prepare(cfg, torch.device("cpu"), synthetic)
    with pytest.raises(FeddrKitError, match="SuperNodes connected"):
        flower.KitStrategy(setup).discover(grid, timeout=0.0)


def test_run_config_round_trips_every_config_field():
    cfg = fk.Config(algorithm="scaffold", lr=0.05, regularizer="prox", lr_decay_at=(0.25, 0.5), partition_seed=3,
                    probes=False, dataset="synthetic")
    values = flower.config_to_run_config(cfg)
    assert all(isinstance(v, (bool, int, float, str)) for v in values.values())
    assert flower.config_from_run_config(values) == cfg
    assert flower.config_from_run_config(flower.config_to_run_config(fk.Config(lr_decay_at=()))).lr_decay_at == ()
    with pytest.raises(FeddrKitError, match="unknown key"):
        flower.config_from_run_config({**values, "rounds_": 3})


def test_written_app_names_the_components_and_holds_the_config(tmp_path):
    cfg = fk.Config(algorithm="feddr+", rounds=2, dataset="synthetic", lr=0.02)
    path = flower.write_app(cfg, tmp_path / "app")
    doc = tomllib.loads(path.read_text())
    app = doc["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "feddr_kit.flower:server_app", "clientapp": "feddr_kit.flower:client_app"}
    assert flower.config_from_run_config(app["config"]) == cfg
    from flwr.common.config import validate_config

    ok, errors, _ = validate_config(doc, check_module=True, project_dir=tmp_path / "app")
    assert ok, errors


def test_unsupported_settings_and_missing_results_fail_loudly(tmp_path):
    with pytest.raises(FeddrKitError, match="probes"):
        flower.check_supported(fk.Config(probes=True))
    with pytest.raises(FeddrKitError, match="batched"):
        flower.check_supported(fk.Config(engine="batched"))
    with pytest.raises(FeddrKitError, match="summary.json"):  # `flwr run --stream` exits 0 after a crash
        flower.check_outcome(fk.Config(rounds=2), tmp_path)
    with pytest.raises(FeddrKitError, match="out_dir"):
        flower.simulate(fk.Config(dataset="synthetic"))


@pytest.mark.parametrize("superlink", [None, "127.0.0.1:8000"])
def test_flwr_home_names_the_one_superlink_flower_reads(tmp_path, monkeypatch, superlink):
    """Flower itself reads the FLWR_HOME written: the managed local SuperLink, or the deployment's, without TLS."""
    from flwr.cli.flower_config import read_superlink_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    flower.write_flwr_home(tmp_path, superlink)
    connection = read_superlink_connection()  # the default one, as `flwr run APP` without a name takes it
    if superlink is None:
        assert (connection.name, connection.address) == ("local", ":local:")
    else:
        assert (connection.name, connection.address, connection.insecure) == ("deployment", superlink, True)


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost:", ":8000", "host:port", "host:70000"])
def test_a_superlink_address_must_read_host_port(tmp_path, address):
    with pytest.raises(FeddrKitError, match="HOST:PORT"):
        flower.write_flwr_home(tmp_path, address)
    assert not (tmp_path / "config.toml").exists()


@pytest.mark.parametrize("typed, says", [(["--federation", "deployment"], "needs --superlink"),
                                         (["--superlink", "127.0.0.1:8000"], "is for --federation deployment")])
def test_the_deployment_flags_go_together(tmp_path, capsys, typed, says):
    from feddr_kit.__main__ import main

    assert main(["flower", "--dataset", "synthetic", "--out-dir", str(tmp_path / "f"), *typed]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
    assert not (tmp_path / "f").exists()  # refused before anything was written


def test_upload_kinds_are_declared_and_checked():
    algo = fk.algorithms.get_algorithm(fk.Config(algorithm="fedexp"))
    scalars, arrays = flower.pack_uploads(algo, {"delta_sq_norm": 0.1 + 0.2})
    assert scalars == {"upload.delta_sq_norm": 0.1 + 0.2} and arrays == {}  # float64 kept exactly
    with pytest.raises(FeddrKitError, match="declare"):
        flower.pack_uploads(algo, {"something_else": 1.0})


def test_importing_the_kit_does_not_import_flower():
    code = "import sys, feddr_kit; assert 'flwr' not in sys.modules, 'flwr imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_launcher_and_the_command_line_do_not_import_flower():
    code = ("import sys, feddr_kit.__main__; from feddr_kit import flower; flower.simulate, flower.check_installed; "
            "assert 'flwr' not in sys.modules, 'flwr imported'; flower.run_in_process; assert 'flwr' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_face_gives_the_apps_names_and_flower_finds_the_components():
    import ast

    from flwr.supercore.object_ref import load_app, validate

    from feddr_kit.flower import apps, launch
    body = ast.parse(Path(apps.__file__).read_text()).body
    defined = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    public = {n for n in defined if not n.startswith("_")}
    assert public <= set(flower.__all__), f"add to feddr_kit.flower's __all__: {sorted(public - set(flower.__all__))}"
    for name in flower.__all__:
        assert getattr(flower, name) is getattr(launch if name in vars(launch) else apps, name), name
    for ref, app in (("feddr_kit.flower:server_app", apps.server_app), ("feddr_kit.flower:client_app", apps.client_app)):
        assert validate(ref, check_module=True, project_dir=REPO) == (True, None)  # Flower reads the source for the name
        assert load_app(ref, ImportError) is app


def simulation_wanted() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("FEDDR_FLOWER_SIMULATION") == "1"


@pytest.mark.slow
@pytest.mark.skipif(not simulation_wanted(), reason="needs flwr[simulation] (Ray) and FEDDR_FLOWER_SIMULATION=1: "
                                                    "Ray's start-up takes about a minute")
def test_real_flwr_run_simulation_equals_fk_run(synthetic, tmp_path):
    """`python -m feddr_kit flower` (SuperLink, `flwr run`, Ray): FedDr+, 4 clients, 2 rounds, within 10 minutes."""
    args = ["--dataset", "synthetic", "--algorithm", "feddr+", "--num-clients", "4", "--clients-per-round", "3",
            "--shards-per-client", "5", "--rounds", "2", "--local-epochs", "1", "--eval-every", "1", "--lr-gamma", "1",
            "--device", "cpu", "--out-dir", str(tmp_path / "flower")]  # no --engine: not a flag of the command (auto: serial on CPU)
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "feddr_kit", "flower", *args], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the command stops its SuperLink and Ray before exiting
        out, _ = proc.communicate(timeout=120)
        pytest.fail(f"python -m feddr_kit flower took over 600 s: {out[-2000:]}")
    assert proc.returncode == 0, out[-4000:]
    assert time.time() - start < 600
    history = pd.read_csv(tmp_path / "flower" / "history.csv")
    kit = fk.run(fk.Config(algorithm="feddr+", **TINY), data=synthetic)
    pd.testing.assert_frame_equal(history.drop(columns="seconds"),
                                  pd.read_csv(pd.io.common.StringIO(kit.history.to_csv(index=False))).drop(columns="seconds"),
                                  check_exact=True)
    saved = torch.load(tmp_path / "flower" / "checkpoint.pt", weights_only=False)["global_state"]
    for name, t in kit.model.state_dict().items():
        assert torch.equal(saved[name], t), name
    assert json.loads((tmp_path / "flower" / "summary.json").read_text())["rounds"] == 2
