"""The kit's Flower App on disk and under ``flwr run``: its run config, its files, and the processes.

:func:`config_to_run_config` / :func:`config_from_run_config` carry a :class:`~feddr_kit.Config` in a
Flower run config (flat bool/int/float/str values); :func:`write_app` and :func:`write_flwr_home`
write the App's ``pyproject.toml`` and a ``FLWR_HOME``; :func:`simulate` starts a SuperLink of its own,
runs ``flwr run`` with the local simulation (Ray), stops every process it started and checks the
result files (:func:`check_outcome`); :func:`deploy` runs ``flwr run`` on a SuperLink and SuperNodes
already running (deployment) with the same checks. The apps themselves are in :mod:`feddr_kit.flower`.

This module does not import Flower: the processes it starts do.
"""
from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

from .. import rundir
from ..config import Config
from ..errors import FeddrKitError
from ..methods import ALGORITHMS

APP_DIR, FLWR_HOME_DIR, TIMING = "flower_app", "flwr_home", "flower_timing.json"
LOCAL, DEPLOYMENT = "local", "deployment"  # the SuperLink connections FLWR_HOME names, as `flwr run` takes them
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


# Flower's commands a run starts, beside this Python: `flwr run` always; for the simulation also the SuperLink and
# the SuperExec it starts by name (flwr_environment puts this Python's bin first on PATH).
SIMULATION_COMMANDS, DEPLOYMENT_COMMANDS = ("flwr", "flower-superlink", "flower-superexec"), ("flwr",)


def check_installed(simulation: bool = True) -> None:
    """Raise a one-line :class:`FeddrKitError` naming ``pip install -e ".[flower]"`` when Flower or, for the
    ``simulation``, its engine (Ray) is missing, which ``flwr run`` would otherwise report only after its
    start-up, or when Flower's commands are not beside this Python (:func:`command`). A deployment needs no
    Ray: the SuperNodes run the clients."""
    wanted = ("flwr", "ray") if simulation else ("flwr",)
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    if missing:
        what = "Flower's simulation extra" if simulation else "Flower"
        raise FeddrKitError(f"the flower command needs {what} ({' and '.join(missing)} not installed): {INSTALL}")
    for name in SIMULATION_COMMANDS if simulation else DEPLOYMENT_COMMANDS:
        command(name)


def command(name: str) -> str:
    """The path of Flower's command ``name`` beside the running Python, where ``pip install`` puts it for this
    environment; a one-line :class:`FeddrKitError` naming it and the install when it is not there (Flower
    importable through PYTHONPATH or from another environment, its commands not installed for this Python)."""
    path = Path(sys.executable).parent / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FeddrKitError(f"the flower command needs Flower's `{name}` command beside this Python, but {path} is "
                            f"missing: install Flower into this environment with {sys.executable} -m {INSTALL}")
    return str(path)


# A host name (labels of letters, digits, hyphens and, as container names have them, underscores), an IPv4 address,
# or an IPv6 address in brackets.
_HOST = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?|\[[0-9A-Fa-f:.]+\]")


def check_superlink(address: str) -> str:
    """``address`` if it reads HOST:PORT (a host name or IP address, a port number after the last colon), else a
    one-line :class:`FeddrKitError`: ``flwr run`` would not reach it, and a wait for it would last the whole
    start-up timeout and then blame a slow SuperLink."""
    host, _, port = address.rpartition(":")
    if "://" in address:
        raise FeddrKitError(f"superlink: expected HOST:PORT without a scheme (Flower's SuperLink address, e.g. "
                            f"127.0.0.1:9093), got {address!r}: leave out {address.split('://', 1)[0]}://")
    ok_host = bool(_HOST.fullmatch(host)) and (not host.startswith("[") or _is_ipv6(host[1:-1]))
    if not ok_host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FeddrKitError(f"superlink: expected HOST:PORT (the SuperLink's address: a host name or IP address, a "
                            f"port, e.g. 127.0.0.1:9093), got {address!r}")
    return address


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


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


def write_flwr_home(flwr_home: Path, superlink: str | None = None) -> Path:
    """Write ``FLWR_HOME/config.toml`` with one SuperLink connection: ``local``, the managed local SuperLink,
    or, given ``superlink`` (HOST:PORT), ``deployment``, that SuperLink without TLS (a closed network)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    if superlink is None:
        text = f'[superlink]\ndefault = "{LOCAL}"\n\n[superlink.{LOCAL}]\naddress = ":local:"\n'
    else:
        text = (f'[superlink]\ndefault = "{DEPLOYMENT}"\n\n[superlink.{DEPLOYMENT}]\n'
                f'address = "{check_superlink(superlink)}"\ninsecure = true\n')
    rundir.write_text(path, text)
    return path


def check_outcome(cfg: Config, out_dir: Path, logs: str | None = None) -> dict:
    """The run's ``summary.json`` once it is complete; a :class:`FeddrKitError` when a result file is
    missing or the run stopped early (``flwr run --stream`` exits 0 even when the ServerApp crashed).
    ``logs``: where the error says to look besides the log above (default: the local SuperLink's log)."""
    missing = [n for n in ("config.json", "history.csv", "summary.json", "checkpoint.pt") if not (out_dir / n).exists()]
    if missing:
        logs = logs or f"{out_dir / FLWR_HOME_DIR}/local-superlink/superlink.log"
        raise FeddrKitError(f"the Flower run left no {', '.join(missing)} in {out_dir}: it failed; see the log above "
                            f"and {logs}")
    summary = json.loads((out_dir / "summary.json").read_text())
    if summary.get("rounds") != cfg.rounds:
        raise FeddrKitError(f"the Flower run stopped at round {summary.get('rounds')} of {cfg.rounds}")
    return summary


# --------------------------------------------------------------------------- the processes
def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flwr_environment(home: Path) -> dict:
    """This process's environment for Flower's commands: this ``FLWR_HOME`` (not the user's ``~/.flwr``), no
    runtime dependency installation (so no second torch is installed), no update checks, and this Python's
    ``bin`` first on PATH (the SuperLink and SuperNodes start ``flower-superexec`` by name)."""
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _environment(home: Path, http_port: int, startup_timeout: float, ray_memory_threshold: float | None) -> dict:
    """The environment of the local SuperLink and of ``flwr run`` (:func:`flwr_environment`): the port, and
    Ray's start-up limits."""
    env = {**flwr_environment(home), "RAY_USAGE_STATS_ENABLED": "0", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port)}
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
    cmd = [command("flower-superlink"), "--insecure", "--simulation", "--isolation",
           "subprocess", "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(http_port),
           "--database", str(logs / "state.db"), "--log-file", str(logs / "superlink.log")]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: stopped with all it started


def wait_healthy(address: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Return once the SuperLink at ``address`` (HOST:PORT, no TLS) answers ``/health``: ``flwr run`` gives up at
    once on a SuperLink still starting. A :class:`FeddrKitError` when ``proc`` (the SuperLink, where this
    process started it) exits first, or nothing answers within ``timeout`` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise FeddrKitError(f"the SuperLink exited with code {proc.returncode} while starting")
        try:
            if httpx.get(f"http://{address}/health", timeout=2.0).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise FeddrKitError(f"the SuperLink at {address} did not answer within {timeout:.0f} s (not started yet, or a "
                        "loaded machine: raise --startup-timeout)")


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


def stop_tree(link: subprocess.Popen) -> None:
    """Stop ``link`` (a SuperLink or a SuperNode started with ``start_new_session=True``) and every process
    group it and its children started: SIGTERM, then SIGKILL to what is left."""
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
    _check_run(cfg)
    check_installed()
    nodes = num_supernodes or cfg.num_clients
    if nodes < cfg.num_clients:
        raise FeddrKitError(f"num_supernodes={nodes}: need one SuperNode per client, at least num_clients={cfg.num_clients}")
    t_launch = time.time()
    with _app_folder(cfg) as (cfg, out_dir, app, home):
        http_port = free_port()  # one port serves the Runtime, Control and Fleet HTTP APIs
        env = _environment(home, http_port, startup_timeout, ray_memory_threshold)
        link = _start_superlink(home, http_port, env)
        with _sigterm_exits():
            try:
                wait_healthy(f"127.0.0.1:{http_port}", startup_timeout, link)
                t_link = time.time()
                federation = f"num-supernodes={nodes}" + (
                    f" init-args-num-cpus={ray_num_cpus} client-resources-num-cpus=1" if ray_num_cpus else "")
                _flwr_run(app, LOCAL, env, timeout, stream, "--federation-config", federation)
            finally:
                stop_tree(link)
        summary = check_outcome(cfg, out_dir)
        timings = _timings(out_dir, t_launch)
    return {"wall_s": time.time() - t_launch, "superlink_start_s": t_link - t_launch, **timings, "summary": summary}


def deploy(cfg: Config, superlink: str, *, startup_timeout: float = 300.0, timeout: float = 3600.0,
           stream: bool = True) -> dict:
    """Run ``cfg`` under ``flwr run`` on a SuperLink already running at ``superlink`` (HOST:PORT, no TLS)
    with one SuperNode per client (``--node-config "partition-id=k num-partitions=K"``), and return its timings.

    Writes the app (:func:`write_app`) and a ``FLWR_HOME`` whose one connection, ``deployment``, is that
    SuperLink (:func:`write_flwr_home`) under ``cfg.out_dir`` (claimed for the run), runs ``flwr run APP
    deployment --stream`` once the SuperLink answers (within ``startup_timeout`` seconds) and checks the
    result files (:func:`check_outcome`). It starts and stops no SuperLink or SuperNode. The ServerApp runs
    on the SuperLink's machine and writes the results into ``out_dir`` there (as this machine's absolute
    path), so the checks pass when this runs on that machine, or where both see the same folder.

    Returns ``{"wall_s", "first_round_start_s", "round_seconds", "model_bytes", "summary"}`` as
    :func:`simulate` does (without a SuperLink's start-up).
    """
    _check_run(cfg)
    check_superlink(superlink)
    check_installed(simulation=False)
    t_launch = time.time()
    with _app_folder(cfg, superlink) as (cfg, out_dir, app, home):
        with _sigterm_exits():
            wait_healthy(superlink, startup_timeout)
            _flwr_run(app, DEPLOYMENT, flwr_environment(home), timeout, stream)
        summary = check_outcome(cfg, out_dir, logs=f"the SuperLink's and SuperNodes' logs (the ServerApp writes "
                                                   f"{out_dir} on the SuperLink's machine)")
        timings = _timings(out_dir, t_launch)
    return {"wall_s": time.time() - t_launch, **timings, "summary": summary}


@contextlib.contextmanager
def _app_folder(cfg: Config, superlink: str | None = None) -> Iterator[tuple[Config, Path, Path, Path]]:
    """Claim ``cfg.out_dir`` for one Flower run, emptied of an old run's results (``cfg.overwrite``: a run that
    then crashes leaves no ``summary.json`` to pass as its own), and write the app and a ``FLWR_HOME`` into it
    (its one connection: ``superlink``, or the local SuperLink when None). Yields ``(cfg, out_dir, app, home)``:
    ``cfg`` with the folder's absolute path and progress off (the ServerApp runs in another process and
    folder), the folder, the app's folder and the ``FLWR_HOME``; the folder is released on leaving."""
    with rundir.claim(Path(cfg.out_dir), resume=False, overwrite=cfg.overwrite) as out_dir:
        out_dir = out_dir.resolve()
        # claim removed the run's result files; the ServerApp's timings go too, so none of the old run's is read
        (out_dir / TIMING).unlink(missing_ok=True)
        cfg = cfg.replace(out_dir=str(out_dir), progress=False)
        app = write_app(cfg, out_dir / APP_DIR).parent
        home = out_dir / FLWR_HOME_DIR
        write_flwr_home(home, superlink)
        yield cfg, out_dir, app, home


def _check_run(cfg: Config) -> None:
    """Refuse, before anything starts, what Flower does not run and an out_dir that is missing or already used."""
    check_supported(cfg)
    if not cfg.out_dir:
        raise FeddrKitError("out_dir: the flower command needs an out_dir (the app, FLWR_HOME and the results go there)")
    found = [name for name in rundir.RESULT_FILES if (Path(cfg.out_dir) / name).exists()]
    if found and not cfg.overwrite:  # said here, as a Flower run cannot be resumed (claim's message offers that)
        raise FeddrKitError(f"out_dir: {cfg.out_dir} already holds a run's results ({', '.join(found)}); pass "
                            "overwrite=True (--overwrite) to replace them, or another out_dir (a Flower run is not resumed)")


def _flwr_run(app: Path, connection: str, env: dict, timeout: float, stream: bool, *options: str) -> None:
    """``flwr run APP CONNECTION [options] [--stream]`` in the app's parent folder; a :class:`FeddrKitError` on
    a non-zero exit or past ``timeout`` seconds (the command is then killed)."""
    cmd = [command("flwr"), "run", str(app), connection, *options] + (["--stream"] if stream else [])
    try:
        done = subprocess.run(cmd, env=env, cwd=app.parent, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FeddrKitError(f"flwr run took over {timeout:.0f} s (--timeout) and was stopped; in a deployment the run "
                            f"may go on on the SuperLink: FLWR_HOME={env['FLWR_HOME']} flwr stop RUN_ID ends it") from None
    if done.returncode != 0:
        raise FeddrKitError(f"flwr run exited with code {done.returncode}")


def _timings(out_dir: Path, t_launch: float) -> dict:
    """What the ServerApp measured (:data:`TIMING`), relative to ``t_launch`` (``time.time()`` at the start)."""
    timing = json.loads((out_dir / TIMING).read_text()) if (out_dir / TIMING).exists() else {}
    return {"first_round_start_s": timing.get("first_round_start", math.nan) - t_launch,
            "round_seconds": timing.get("round_seconds", []), "model_bytes": timing.get("model_bytes")}
