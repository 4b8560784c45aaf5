"""Flower's deployment path with real processes on loopback: a SuperLink, two SuperNodes (partitions 0
and 1, each with its own Runtime API port) and ``python -m feddr_kit flower --federation deployment``,
whose history, final weights, ``config.json`` and ``summary.json`` equal ``fk.run``'s.

Every process gets an ``FLWR_HOME`` of its own in the test's temporary folder (nothing reaches the
user's ``~/.flwr``) and this Python's ``bin`` first on PATH: CI runs ``.venv/bin/python -m pytest``
without the venv on PATH, and the SuperLink and SuperNodes start ``flower-superexec`` by name. Each
process starts in a session of its own and is stopped by its process group at teardown, pass or fail.
Needs plain ``flwr`` only (no Ray).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("flwr")

import feddr_kit as fk  # noqa: E402
from feddr_kit.flower import launch  # noqa: E402
from test_hardening_round4 import end_tree, guard  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode: this environment's
PARTITIONS = (0, 1)  # the partition id each SuperNode holds: one per client
CONFIG = dict(dataset="synthetic", algorithm="feddr+", num_clients=2, clients_per_round=2, shards_per_client=5,
              rounds=2, local_epochs=1, eval_every=1, lr_gamma=1.0, device="cpu")
TIMEOUT = 1200  # seconds `flwr run` may take: every Flower process and ClientApp imports torch, on 2 busy cores


@pytest.fixture
def spawn(tmp_path):
    """``spawn(name, *cmd)`` starts ``cmd`` in a session of its own, with its own FLWR_HOME and its output in
    ``tmp_path/NAME.log``; every process started is stopped, with what it started, at teardown, and by a watchdog
    when this process is killed before (at CI's time limit, where no teardown runs)."""
    started = []

    def start(name: str, *cmd: str) -> subprocess.Popen:
        env = {**launch.flwr_environment(tmp_path / f"flwr_home_{name}"), "OMP_NUM_THREADS": "1",
               # the checkout's kit in every process, the ServerApp's and ClientApps' included
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append((proc, log, guard(proc)))
        return proc

    yield start
    for proc, log, watchdog in reversed(started):
        try:
            launch.stop_tree(proc)  # SIGTERM first: each stops what it started
        finally:
            end_tree(proc, watchdog)  # then whatever is left, and the watchdog
            log.close()


def logs(folder: Path, chars: int = 3000) -> str:
    """The end of every process's log, for a failure's message."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(folder.glob("*.log")))


def flags(config: dict) -> list[str]:
    """``config`` as the command line's flags."""
    return [item for k, v in config.items() for item in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.slow  # about three minutes on 2 busy cores: each process and each ClientApp imports torch
def test_deployment_on_loopback_equals_fk_run(spawn, tmp_path, synthetic):
    port = launch.free_port()  # the SuperLink's Fleet, Control and Runtime APIs
    link = spawn("superlink", str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
                 "--disable-runtime-dependency-installation")
    superlink = f"127.0.0.1:{port}"
    launch.wait_healthy(superlink, 300, link)  # so that the SuperNodes connect at their first try
    for k in PARTITIONS:  # on one machine each SuperNode needs a Runtime API port of its own (default 9094)
        spawn(f"supernode{k}", str(BIN / "flower-supernode"), "--insecure", "--superlink", superlink,
              "--port", str(launch.free_port()),
              "--node-config", f"partition-id={k} num-partitions={len(PARTITIONS)}")
    deployed = tmp_path / "deployed"
    cli = spawn("flower", sys.executable, "-m", "feddr_kit", "flower", "--federation", "deployment",
                "--superlink", superlink, *flags(CONFIG), "--out-dir", str(deployed), "--timeout", str(TIMEOUT))
    try:
        code = cli.wait(TIMEOUT + 120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m feddr_kit flower --federation deployment did not end\n{logs(tmp_path)}")
    assert code == 0, logs(tmp_path)

    kit_dir = tmp_path / "kit"
    kit = fk.run(fk.Config(**CONFIG, progress=False, out_dir=str(kit_dir)), data=synthetic)
    pd.testing.assert_frame_equal(pd.read_csv(deployed / "history.csv").drop(columns="seconds"),
                                  pd.read_csv(kit_dir / "history.csv").drop(columns="seconds"), check_exact=True)
    saved = torch.load(deployed / "checkpoint.pt", weights_only=False)["global_state"]
    final = kit.model.state_dict()
    assert list(saved) == list(final)
    for name, tensor in final.items():
        assert torch.equal(saved[name], tensor), name

    def read(folder: Path, name: str) -> dict:
        return json.loads((folder / name).read_text())

    config = {run: read(run, "config.json") for run in (kit_dir, deployed)}
    assert {run: c.pop("out_dir") for run, c in config.items()} == {kit_dir: str(kit_dir), deployed: str(deployed)}
    assert config[deployed] == config[kit_dir]
    timings = ("sec_per_round", "total_seconds")
    summary = {run: {k: v for k, v in read(run, "summary.json").items() if k not in timings} for run in (kit_dir, deployed)}
    assert summary[deployed] == summary[kit_dir]
    assert summary[kit_dir]["rounds"] == CONFIG["rounds"] and kit.history["test_acc"].iloc[-1] > 0.1  # it learned
