"""The kit's Flower App on disk and under ``flwr run``: its run config, its files, and the processes.

:func:`config_to_run_config` / :func:`config_from_run_config` carry a :class:`~feddr_kit.Config` in a
Flower run config (flat bool/int/float/str values); :func:`write_app` and :func:`write_flwr_home`
write the App's ``pyproject.toml`` and a ``FLWR_HOME``; :func:`simulate` starts a SuperLink of its own,
runs ``flwr run`` with the local simulation (Ray), stops every process it started and checks the
result files (:func:`check_outcome`). The apps themselves are in :mod:`feddr_kit.flower`.

This module does not import Flower: the processes it starts do.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

from . import rundir
from .config import Config
from .errors import FeddrKitError
from .methods import ALGORITHMS

APP_DIR, FLWR_HOME_DIR, TIMING = "flower_app", "flwr_home", "flower_timing.json"
UNSUPPORTED = {"probes": True, "engine": "batched"}


# --------------------------------------------------------------------------- Config <-> run config
def config_to_run_config(cfg: Config) -> dict[str, bool | int | float | str]:
    """The Config as Flower run-config values (bool/int/float/str): None fields are left out (they
    default to None), ``lr_decay_at`` becomes a comma-separated string."""
    out: dict[str, bool | int | float | str] = {}
    for name, value in cfg.to_dict().items():
        if value is None:
            continue
        out[name] = ",".join(repr(float(f)) for f in value) if isinstance(value, (list, tuple)) else value
    return out


def config_from_run_config(run_config: dict[str, Any]) -> Config:
    """Inverse of :func:`config_to_run_config` (unknown keys are a :class:`FeddrKitError`)."""
    names = {f.name for f in fields(Config)}
    unknown = sorted(set(run_config) - names)
    if unknown:
        raise FeddrKitError(f"run config: unknown key(s) {', '.join(unknown)}; allowed: the Config fields")
    d = dict(run_config)
    if "lr_decay_at" in d and isinstance(d["lr_decay_at"], str):
        d["lr_decay_at"] = tuple(float(x) for x in d["lr_decay_at"].split(",") if x.strip())
    return Config.from_dict(d)


INSTALL = 'pip install -e ".[flower]"'


def check_installed() -> None:
    """Raise a one-line :class:`FeddrKitError` naming ``pip install -e ".[flower]"`` when Flower or its
    simulation engine (Ray) is missing, which ``flwr run`` would otherwise report only after its start-up."""
    missing = [name for name in ("flwr", "ray") if importlib.util.find_spec(name) is None]
    if missing:
        raise FeddrKitError(f"the flower command needs Flower's simulation extra ({' and '.join(missing)} not installed): "
                            f"{INSTALL}")


def check_supported(cfg: Config) -> None:
    """Raise :class:`FeddrKitError` for the settings the Flower apps do not run."""
    for name, value in UNSUPPORTED.items():
        if getattr(cfg, name) == value:
            raise FeddrKitError(f"{name}={value!r} is not supported on Flower; use fk.run for it")
    if ALGORITHMS[cfg.algorithm].personalized:
        # Their evaluation reads every client's personal model, which on Flower lives on the clients.
        raise FeddrKitError(f"algorithm={cfg.algorithm!r} (personalized) is not supported on Flower yet; use fk.run for it")


# --------------------------------------------------------------------------- the App's files
def write_app(cfg: Config, app_dir: Path) -> Path:
    """Write the Flower App's ``pyproject.toml`` into ``app_dir``: ``[tool.flwr.app.components]`` naming
    ``feddr_kit.flower:server_app`` / ``:client_app`` and ``[tool.flwr.app.config]`` holding the Config
    fields (:func:`config_to_run_config`). Returns its path."""
    import tomli_w

    app_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "feddr-kit-flower", "version": "1.0.0", "license": "MIT",
                    "description": "feddr_kit's algorithms on Flower (written by python -m feddr_kit flower)",
                    "dependencies": ["flwr[simulation]==1.42.*", "feddr_kit"]},
        "tool": {"flwr": {"app": {"publisher": "feddr-kit",
                                  "components": {"serverapp": "feddr_kit.flower:server_app",
                                                 "clientapp": "feddr_kit.flower:client_app"},
                                  "config": config_to_run_config(cfg)}}},
    }
    path = app_dir / "pyproject.toml"
    rundir.write_text(path, tomli_w.dumps(doc))
    return path


def write_flwr_home(flwr_home: Path) -> Path:
    """Write ``FLWR_HOME/config.toml``: one SuperLink connection, ``local``, the managed local SuperLink."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    rundir.write_text(path, '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    return path


def check_outcome(cfg: Config, out_dir: Path) -> dict:
    """The run's ``summary.json`` once it is complete; a :class:`FeddrKitError` when a result file is
    missing or the run stopped early (``flwr run --stream`` exits 0 even when the ServerApp crashed)."""
    missing = [n for n in ("config.json", "history.csv", "summary.json", "checkpoint.pt") if not (out_dir / n).exists()]
    if missing:
        raise FeddrKitError(f"the Flower run left no {', '.join(missing)} in {out_dir}: it failed; see the log above "
                            f"and {out_dir / FLWR_HOME_DIR}/local-superlink/superlink.log")
    summary = json.loads((out_dir / "summary.json").read_text())
    if summary.get("rounds") != cfg.rounds:
        raise FeddrKitError(f"the Flower run stopped at round {summary.get('rounds')} of {cfg.rounds}")
    return summary


# --------------------------------------------------------------------------- the processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(home: Path, http_port: int, startup_timeout: float, ray_memory_threshold: float | None) -> dict:
    """The environment of the SuperLink and of ``flwr run``: this ``FLWR_HOME``, no runtime dependency
    installation (so no second torch is installed), no update checks, the port, and Ray's start-up limits."""
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # flower-superexec
    if ray_memory_threshold is not None:
        env["RAY_memory_usage_threshold"] = str(ray_memory_threshold)
    # Ray's raylet gives its dashboard agent a few seconds to start; a loaded machine needs more
    env.setdefault("RAY_agent_register_timeout_ms", str(int(startup_timeout * 1000)))
    env.setdefault("RAY_raylet_start_wait_time_s", str(int(startup_timeout)))
    return env


def _start_superlink(home: Path, http_port: int, env: dict) -> subprocess.Popen:
    """Start a SuperLink (simulation, subprocess isolation) on ``http_port``, its logs and state under ``home``."""
    logs = home / "local-superlink"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "flower-superlink"), "--insecure", "--simulation", "--isolation",
           "subprocess", "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(http_port),
           "--database", str(logs / "state.db"), "--log-file", str(logs / "superlink.log")]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: stopped with all it started


def _wait_healthy(port: int, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FeddrKitError(f"the SuperLink exited with code {proc.returncode} while starting")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise FeddrKitError(f"the SuperLink did not answer within {timeout:.0f} s (a loaded machine: raise --startup-timeout)")


def _process_groups_under(pid: int) -> set[int]:
    """Process groups of ``pid`` and of its children (the SuperLink detaches its SuperExec, which starts
    the simulation and Ray, into a session of its own)."""
    groups = {os.getpgid(pid)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields_ = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields_[1]) == pid:  # ppid
            groups.add(int(fields_[2]))  # pgrp
    return groups


def _stop(link: subprocess.Popen) -> None:
    """Stop the SuperLink ``link`` and every process group it and its children started."""
    try:
        groups = _process_groups_under(link.pid)
    except ProcessLookupError:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass
        try:
            link.wait(20)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            time.sleep(2.0)  # let the SuperExec's group finish its own shutdown, then make sure


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While inside, a SIGTERM exits through Python (so ``finally`` blocks stop the SuperLink); main thread only."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    if main:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def simulate(cfg: Config, *, num_supernodes: int | None = None, startup_timeout: float = 300.0,
             timeout: float = 3600.0, ray_memory_threshold: float | None = 0.98, ray_num_cpus: int | None = 1,
             stream: bool = True) -> dict:
    """Run ``cfg`` under ``flwr run`` with the local simulation (Ray) and return its timings.

    Writes the app (:func:`write_app`) and ``FLWR_HOME`` (:func:`write_flwr_home`) under ``cfg.out_dir``
    (claimed for the run, :func:`feddr_kit.rundir.claim`), starts a SuperLink of its own on a free port,
    runs ``flwr run APP local --federation-config num-supernodes=N --stream``, stops the SuperLink, and
    checks the result files (:func:`check_outcome`). ``num_supernodes`` defaults to ``num_clients`` (one
    node per partition). ``ray_memory_threshold`` sets ``RAY_memory_usage_threshold`` (Ray counts other
    processes' memory too), None leaves it. ``ray_num_cpus``: the CPUs Ray may use, one per ClientApp
    actor (default 1: one actor serves every client in turn, and Ray starts one worker instead of one
    per core, which lets its start-up, limited to a fixed 30 s, pass on a loaded machine); None: Ray's
    default (all cores, 2 per actor).

    Returns ``{"wall_s", "superlink_start_s", "first_round_start_s", "round_seconds", "model_bytes",
    "summary"}``: wall time of the whole command, the SuperLink's start-up, the time from launch to the
    ServerApp's first round (SuperLink, app build, Ray and ServerApp start-up), each round's seconds,
    the global model's size and the run's summary.
    """
    check_supported(cfg)
    if not cfg.out_dir:
        raise FeddrKitError("out_dir: the flower command needs an out_dir (the app, FLWR_HOME and the results go there)")
    found = [name for name in rundir.RESULT_FILES if (Path(cfg.out_dir) / name).exists()]
    if found and not cfg.overwrite:  # said here, as a Flower run cannot be resumed (claim's message offers that)
        raise FeddrKitError(f"out_dir: {cfg.out_dir} already holds a run's results ({', '.join(found)}); pass "
                            "overwrite=True (--overwrite) to replace them, or another out_dir (a Flower run is not resumed)")
    check_installed()
    nodes = num_supernodes or cfg.num_clients
    if nodes < cfg.num_clients:
        raise FeddrKitError(f"num_supernodes={nodes}: need one SuperNode per client, at least num_clients={cfg.num_clients}")
    t_launch = time.time()
    with rundir.claim(Path(cfg.out_dir), resume=False, overwrite=cfg.overwrite) as out_dir:
        out_dir = out_dir.resolve()
        cfg = cfg.replace(out_dir=str(out_dir), progress=False)
        app = write_app(cfg, out_dir / APP_DIR).parent
        home = out_dir / FLWR_HOME_DIR
        write_flwr_home(home)
        http_port = _free_port()  # one port serves the Runtime, Control and Fleet HTTP APIs
        env = _environment(home, http_port, startup_timeout, ray_memory_threshold)
        link = _start_superlink(home, http_port, env)
        with _sigterm_exits():
            try:
                _wait_healthy(http_port, link, startup_timeout)
                t_link = time.time()
                federation = f"num-supernodes={nodes}" + (
                    f" init-args-num-cpus={ray_num_cpus} client-resources-num-cpus=1" if ray_num_cpus else "")
                run_cmd = [str(Path(sys.executable).parent / "flwr"), "run", str(app), "local",
                           "--federation-config", federation] + (["--stream"] if stream else [])
                done = subprocess.run(run_cmd, env=env, cwd=out_dir, timeout=timeout)
                if done.returncode != 0:
                    raise FeddrKitError(f"flwr run exited with code {done.returncode}")
            finally:
                _stop(link)
        summary = check_outcome(cfg, out_dir)
        timing = json.loads((out_dir / TIMING).read_text()) if (out_dir / TIMING).exists() else {}
    return {"wall_s": time.time() - t_launch, "superlink_start_s": t_link - t_launch,
            "first_round_start_s": timing.get("first_round_start", math.nan) - t_launch,
            "round_seconds": timing.get("round_seconds", []),
            "model_bytes": timing.get("model_bytes"), "summary": summary}
