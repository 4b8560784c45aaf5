"""The kit's algorithms on Flower (flwr 1.42, Message API), from the same code as :func:`feddr_kit.run`.

``client_app`` (a :class:`flwr.clientapp.ClientApp`) trains one client from the global state it
receives; ``server_app`` (a :class:`flwr.serverapp.ServerApp`) runs :class:`KitStrategy`, which samples,
aggregates, evaluates and checkpoints. Both call the pieces of :mod:`feddr_kit.federated` that
``fk.run`` calls (:func:`~feddr_kit.federated.prepare`, :func:`~feddr_kit.federated.plan_round`,
:func:`~feddr_kit.federated.train_clients`, :func:`~feddr_kit.federated.accumulate`,
:func:`~feddr_kit.federated.next_global_state`, :func:`~feddr_kit.federated.evaluate_global`,
:func:`~feddr_kit.federated.save_checkpoint`), so no algorithm has a second implementation and, on
CPU with ``engine="serial"``, a Flower run's history and weights equal ``fk.run``'s bit for bit.

What crosses the wire, per round and sampled client:

- server → client (``train``): ``"global"`` the global state (:class:`~flwr.app.ArrayRecord`),
  ``"broadcast"`` the algorithm's extras (``Algorithm.broadcast``, SCAFFOLD's ``c``), ``"config"``
  the round, lr and the partition id the message is for;
- client → server: ``"state"`` its final local state, ``"metrics"`` partition id, number of
  examples, mean local loss and the scalar uploads, and one ArrayRecord ``"upload.<key>"`` per
  tensor upload (``Algorithm.uploads`` types them).

A client's persistent state (``Algorithm.client_state``, SCAFFOLD's ``c_i``) lives in the
client's ``context.state``; the algorithm object that trains it is made afresh for every message,
because one simulation actor serves many clients. Clients are sampled by the kit's
:func:`~feddr_kit.federated.sample_clients` over partition ids (learned once with a ``query``
message), not by Flower's sampler, and the replies are summed in the sample's order. The server
evaluates the global model centrally on the test set (``configure_evaluate`` sends nothing).

Not supported here: ``probes=True``, ``resume`` and ``engine="batched"`` (clients train one per
message). SphereFed's calibration reads every client's training images on the server, as
``fk.run`` does (a shortcut a real deployment would replace by uploaded ``G_k``, ``B_k``).

Needs ``pip install 'feddr_kit[flower]'``; ``import feddr_kit`` never imports this module.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from . import engine as engine_mod
from . import federated as fed
from . import instruments
from .config import Config
from .data import ImageData
from .errors import FeddrKitError
from .partition import Partition

try:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import Strategy
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("feddr_kit.flower needs Flower: pip install 'feddr_kit[flower]' "
                      "(flwr[simulation]==1.42.*)") from err

PARTITION_ID = "partition-id"  # the node_config key Flower's simulation sets, and SuperNodes get
GRADIENTS = "gradient-ratios."  # prefix of a client's instrument sums in its reply's metrics
CLIENT_STATE = "feddr-client-state"  # the key of a client's persistent state in context.state
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


def check_supported(cfg: Config) -> None:
    """Raise :class:`FeddrKitError` for the settings the Flower apps do not run."""
    for name, value in UNSUPPORTED.items():
        if getattr(cfg, name) == value:
            raise FeddrKitError(f"{name}={value!r} is not supported on Flower; use fk.run for it")
    from .algorithms import ALGORITHMS

    if cfg.algorithm in ALGORITHMS and ALGORITHMS[cfg.algorithm].personalized:
        # Their evaluation reads every client's personal model, which on Flower lives on the clients.
        raise FeddrKitError(f"algorithm={cfg.algorithm!r} (personalized) is not supported on Flower yet; use fk.run for it")


# --------------------------------------------------------------------------- tensors <-> records
def to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """An :class:`~flwr.app.ArrayRecord` of named tensors (copied to CPU; dtypes and shapes kept)."""
    if not tensors:
        return ArrayRecord()
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def from_record(record: ArrayRecord, device: torch.device) -> dict[str, torch.Tensor]:
    """Named tensors on ``device`` from an :class:`~flwr.app.ArrayRecord` (exact copies of the arrays)."""
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)).to(device) for k, a in record.items()}


def pack_uploads(algo, upload: dict) -> tuple[dict[str, float], dict[str, ArrayRecord]]:
    """Split ``algo.client_end``'s upload by the kinds ``algo.uploads`` declares: scalars (for a
    MetricRecord, as ``"upload.<key>"``) and tensor dicts (one ArrayRecord each, ``"upload.<key>"``)."""
    if set(upload) != set(algo.uploads):
        raise FeddrKitError(f"algorithm {algo.name!r}: client_end returned {sorted(upload)} but its uploads "
                            f"declare {sorted(algo.uploads)}")
    scalars, arrays = {}, {}
    for key, kind in algo.uploads.items():
        if kind == "scalar":
            scalars[f"upload.{key}"] = float(upload[key])
        elif kind == "tensors":
            arrays[f"upload.{key}"] = to_record(upload[key])
        else:
            raise FeddrKitError(f"algorithm {algo.name!r}: upload {key!r} has kind {kind!r}; allowed: scalar, tensors")
    return scalars, arrays


def unpack_uploads(algo, content: RecordDict, device: torch.device) -> dict:
    """Inverse of :func:`pack_uploads` on a reply's content."""
    metrics = content["metrics"]
    return {key: (float(metrics[f"upload.{key}"]) if kind == "scalar" else from_record(content[f"upload.{key}"], device))
            for key, kind in algo.uploads.items()}


# --------------------------------------------------------------------------- the client
_SETUPS: dict[str, fed.RunSetup] = {}  # one per process (a simulation actor serves many clients)
_DATA: dict[tuple, ImageData] = {}


def client_setup(cfg: Config) -> fed.RunSetup:
    """The process's :class:`~feddr_kit.federated.RunSetup` for ``cfg`` (data, partition, models),
    built once and reused by every message; a fresh algorithm replaces its ``algo`` per message."""
    key = cfg.to_json()
    if key not in _SETUPS:
        _SETUPS.clear()
        data = _DATA.get((cfg.dataset, cfg.data_path))
        _SETUPS[key] = fed.prepare(cfg, fed.resolve_device(cfg.device), data)
    return _SETUPS[key]


def provide_data(cfg: Config, data: ImageData) -> None:
    """Make this process's clients use ``data`` (already loaded) for ``cfg.dataset`` instead of loading it."""
    _DATA[(cfg.dataset, cfg.data_path)] = data


client_app = ClientApp()


@client_app.query()
def client_query(msg: Message, context: Context) -> Message:
    """Answer the server's question: which partition (client id) this node holds."""
    return Message(RecordDict({"node": ConfigRecord({PARTITION_ID: int(context.node_config[PARTITION_ID])})}),
                   reply_to=msg)


@client_app.train()
def client_train(msg: Message, context: Context) -> Message:
    """Train this node's client from the received global state; reply with its state and uploads."""
    cfg = config_from_run_config(dict(context.run_config))
    client = int(context.node_config[PARTITION_ID])
    conf = msg.content["config"]
    if int(conf["client"]) != client:
        raise FeddrKitError(f"a train message for partition {conf['client']} reached the node of partition {client}")
    setup = client_setup(cfg)
    with engine_mod.kernel_settings(cfg.deterministic, setup.device):
        algo = fed.get_algorithm(cfg)  # afresh: no state of another client can leak in
        algo.setup(setup.model, cfg.seed)
        setup.algo = algo
        global_state = from_record(msg.content["global"], setup.device)
        algo.receive_broadcast(from_record(msg.content["broadcast"], setup.device))
        own = context.state[CLIENT_STATE] if CLIENT_STATE in context.state else ArrayRecord()
        algo.set_client_state(client, from_record(own, setup.device))
        if algo.needs_teacher:
            fed.load_teacher(setup, global_state)
        ctx = fed.client_context(setup, client, int(conf["round"]), float(conf["lr"]), global_state,
                                 measure=bool(conf["measure"]))
        [(ctx, loss, upload)] = list(fed.train_clients(setup, [ctx], engine="serial"))
        context.state[CLIENT_STATE] = to_record(algo.client_state(client))
        scalars, arrays = pack_uploads(algo, upload)
        if ctx.gradients is not None:  # the instruments' per-client sums, sent as exact float64s
            scalars.update({f"{GRADIENTS}{k}": v for k, v in ctx.gradients.as_floats().items()})
        reply = RecordDict({
            "state": to_record(setup.model.state_dict()),
            "metrics": MetricRecord({PARTITION_ID: client, "num-examples": ctx.num_samples, "train-loss": loss, **scalars}),
            **arrays,
        })
    return Message(reply, reply_to=msg)


# --------------------------------------------------------------------------- the server
class KitStrategy(Strategy):
    """The kit's round on Flower's :meth:`Strategy.start` loop: the kit's sampling over partition ids,
    aggregation in the sample's order, central evaluation, checkpoints in ``out_dir``.

    After :meth:`start`, ``global_state``, ``rows`` (the history) and ``round_seconds`` hold the run.
    """

    def __init__(self, setup: fed.RunSetup, out_dir: Path | None = None,
                 callback: Callable[[dict], None] | None = None):
        self.setup = setup
        self.cfg = setup.cfg
        self.out_dir = out_dir
        self.callback = callback
        self.global_state = setup.initial_state
        self.evaluator = fed.Evaluator(setup.data, setup.partition, self.cfg.seed)
        self.rows: list[dict] = []
        self.round_seconds: list[float] = []
        self.nodes: dict[int, int] = {}  # partition id -> node id
        self.plan: fed.RoundPlan | None = None
        self.losses: list[float] = []
        self.gradients: list[instruments.GradientRatios | None] = []  # the round's clients' gradient-ratio sums
        self._t0 = 0.0
        self.first_round_start: float | None = None  # wall-clock time (time.time()) round 1 began

    def discover(self, grid: Grid, timeout: float = 600.0) -> dict[int, int]:
        """Wait for ``num_clients`` nodes, ask each for its partition id (one ``query`` message each) and
        return the map partition id -> node id; a missing or repeated id is a :class:`FeddrKitError`."""
        want = self.cfg.num_clients
        deadline = time.monotonic() + timeout
        while len(node_ids := list(grid.get_node_ids())) < want:
            if time.monotonic() > deadline:
                raise FeddrKitError(f"only {len(node_ids)} of num_clients={want} SuperNodes connected in {timeout:.0f} s")
            time.sleep(1.0)
        queries = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in node_ids]
        replies = list(grid.send_and_receive(queries, timeout=timeout))
        found: dict[int, int] = {}
        for r in replies:
            if r.has_error():
                raise FeddrKitError(f"node {r.metadata.src_node_id} did not say its partition: {r.error.reason}")
            k = int(r.content["node"][PARTITION_ID])
            if k in found:
                raise FeddrKitError(f"two nodes ({found[k]}, {r.metadata.src_node_id}) hold partition {k}")
            found[k] = r.metadata.src_node_id
        missing = sorted(set(range(want)) - set(found))
        if missing:
            raise FeddrKitError(f"no node holds partition(s) {missing}; start one SuperNode per client with "
                                f"--node-config 'partition-id=K num-partitions={want}'")
        self.nodes = found
        return found

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        t = server_round - 1
        self._t0 = time.perf_counter()
        if self.first_round_start is None:
            self.first_round_start = time.time()
        self.plan = fed.plan_round(self.cfg, self.setup.lr0, t, self.setup.partition)
        broadcast = to_record(self.setup.algo.broadcast())
        return [Message(RecordDict({"global": arrays, "broadcast": broadcast,
                                    "config": ConfigRecord({"round": t, "lr": self.plan.lr, "client": k,
                                                            "measure": self.plan.evaluating})}),
                        dst_node_id=self.nodes[k], message_type=MessageType.TRAIN, group_id=str(server_round))
                for k in self.plan.clients]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        plan, setup = self.plan, self.setup
        by_client = {}
        for r in replies:
            if r.has_error():
                raise FeddrKitError(f"round {server_round}: node {r.metadata.src_node_id} failed: {r.error.reason}")
            by_client[int(r.content["metrics"][PARTITION_ID])] = r.content
        missing = sorted(set(plan.clients) - set(by_client))
        if missing:
            raise FeddrKitError(f"round {server_round}: no reply from client(s) {missing}")
        average = fed.new_average(self.global_state)
        uploads, self.losses, self.gradients = [], [], []
        for k, w in zip(plan.clients, plan.weights):  # the sample's order: the kit's float sums
            content = by_client[k]
            state = from_record(content["state"], setup.device)
            fed.accumulate(average, [state[n] for n in average], w)
            uploads.append(unpack_uploads(setup.algo, content, setup.device))
            self.losses.append(float(content["metrics"]["train-loss"]))
            sums = {key[len(GRADIENTS):]: v for key, v in content["metrics"].items() if key.startswith(GRADIENTS)}
            self.gradients.append(instruments.GradientRatios.from_floats(sums) if sums else None)
        self.global_state = fed.next_global_state(setup.algo, self.global_state, average, uploads, plan.weights,
                                                  plan.round)
        fed.finish_round(setup, self.global_state, plan.round)
        return to_record(self.global_state), MetricRecord({"train_loss": float(np.mean(self.losses))})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []  # the server evaluates centrally (evaluate)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        """Flower logs this at the start."""
        logging.getLogger("flwr").info("feddr_kit %s: %d clients, %d per round, %d rounds", self.cfg.algorithm,
                                       self.cfg.num_clients, self.cfg.clients_per_round, self.cfg.rounds)

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """``evaluate_fn`` of :meth:`Strategy.start`: the kit's evaluation (on evaluated rounds), the round's
        seconds, and the checkpoint."""
        if server_round == 0:
            return None
        plan = self.plan
        row = None
        if plan.evaluating:
            row = fed.evaluate_global(self.setup, self.evaluator, self.global_state, plan, self.losses)
            row.update(instruments.round_ratios(self.gradients))
            row["seconds"] = time.perf_counter() - self._t0
            self.rows.append(row)
            if self.callback is not None:
                self.callback(dict(row))
        self.round_seconds.append(time.perf_counter() - self._t0)
        if self.out_dir is not None and fed.checkpoint_due(self.cfg, plan.round):
            fed.save_checkpoint(self.out_dir, plan.round + 1, self.global_state, self.setup.algo, self.rows,
                                self.round_seconds, self.cfg)
        return None if row is None else MetricRecord({k: float(v) for k, v in row.items()})


def run_on_grid(grid: Grid, cfg: Config, data: ImageData | None = None, partition: Partition | None = None,
                callback: Callable[[dict], None] | None = None, timeout: float = 3600.0) -> fed.Result:
    """Run ``cfg`` as the ServerApp does, over ``grid`` (Flower's, or :class:`InProcessGrid`); returns the
    same :class:`~feddr_kit.federated.Result` as ``fk.run``. Writes config.json, history.csv,
    checkpoint.pt and summary.json to ``cfg.out_dir`` when set (the folder is not claimed here)."""
    check_supported(cfg)
    device = fed.resolve_device(cfg.device)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else None
    with engine_mod.kernel_settings(cfg.deterministic, device):
        setup = fed.prepare(cfg, device, data, partition)
        if out_dir is not None:
            fed.write_text(out_dir / "config.json", cfg.to_json() + "\n")
        strategy = KitStrategy(setup, out_dir, callback)
        strategy.discover(grid, timeout=min(timeout, 600.0))
        strategy.start(grid, to_record(setup.initial_state), num_rounds=cfg.rounds, timeout=timeout,
                       evaluate_fn=strategy.evaluate)
        result = fed.finish_run(setup, strategy.global_state, strategy.rows, strategy.round_seconds, out_dir)
    if out_dir is not None:  # for simulate(): when the rounds ran, seen from the ServerApp
        fed.write_json(out_dir / TIMING, {"first_round_start": strategy.first_round_start,
                                          "round_seconds": strategy.round_seconds,
                                          "model_bytes": sum(v.numel() * v.element_size() for v in strategy.global_state.values())})
    return result


server_app = ServerApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """The ServerApp: the run the app's run config (the Config fields) describes."""
    cfg = config_from_run_config(dict(context.run_config))
    result = run_on_grid(grid, cfg)
    print(f"feddr_kit on Flower: final accuracy {result.summary['final_acc']:.4f}, "
          f"{result.summary['sec_per_round']:.2f} s per round (median)")


# --------------------------------------------------------------------------- in process (tests, chapter 09)
class InProcessGrid(Grid):
    """A :class:`~flwr.serverapp.Grid` that delivers each message by calling ``app(message, context)`` in
    this process, with one :class:`~flwr.app.Context` per node (node ids deliberately unlike partition
    ids). No Ray, no SuperLink: the ClientApp and the strategy exactly as Flower calls them."""

    def __init__(self, app: ClientApp, cfg: Config, first_node_id: int = 7001):
        from flwr.supercore.task_identity import TaskIdentity

        for attr, value in (("run_id", 1), ("node_id", 0), ("task_id", 1)):  # outside a real run, as run_serverapp
            if getattr(TaskIdentity, f"_{attr}") is None:
                setattr(TaskIdentity, attr, value)
        self.app = app
        run_config = config_to_run_config(cfg)
        k = cfg.num_clients
        # node ids in reverse partition order: the strategy must map them, not assume them
        self.contexts = {first_node_id + k - 1 - p: Context(run_id=1, node_id=first_node_id + k - 1 - p,
                                                             node_config={PARTITION_ID: p, "num-partitions": k},
                                                             state=RecordDict(), run_config=dict(run_config))
                         for p in range(k)}
        self._run = None
        self.messages = 0

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("InProcessGrid delivers with send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("InProcessGrid delivers with send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for m in messages:
            self.messages += 1
            replies.append(self.app(m, self.contexts[m.metadata.dst_node_id]))
        return replies


def run_in_process(cfg: Config, data: ImageData | None = None, partition: Partition | None = None,
                   callback: Callable[[dict], None] | None = None, quiet: bool = True) -> fed.Result:
    """``cfg`` through ``client_app`` and :class:`KitStrategy` over an :class:`InProcessGrid` (no Ray):
    the Flower code path in one process. ``data`` is given to the clients too; ``quiet`` hides
    Flower's INFO log lines."""
    if data is not None:
        provide_data(cfg, data)
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    if quiet:
        flwr_log.setLevel(logging.WARNING)
    try:
        return run_on_grid(InProcessGrid(client_app, cfg), cfg, data, partition, callback)
    finally:
        flwr_log.setLevel(level)
        _SETUPS.clear()
        _DATA.clear()



# --------------------------------------------------------------------------- `flwr run` from the command line
APP_DIR, FLWR_HOME_DIR, TIMING = "flower_app", "flwr_home", "flower_timing.json"


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
    fed.write_text(path, tomli_w.dumps(doc))
    return path


def write_flwr_home(flwr_home: Path) -> Path:
    """Write ``FLWR_HOME/config.toml``: one SuperLink connection, ``local``, the managed local SuperLink."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    fed.write_text(path, '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, proc, timeout: float) -> None:
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
    import os

    groups = {os.getpgid(pid)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields_ = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields_[1]) == pid:  # ppid
            groups.add(int(fields_[2]))  # pgrp
    return groups


def _stop(link) -> None:
    """Stop the SuperLink ``link`` (a Popen) and every process group it and its children started."""
    import os
    import signal
    import subprocess

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
    return


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


def simulate(cfg: Config, *, num_supernodes: int | None = None, startup_timeout: float = 300.0,
             timeout: float = 3600.0, ray_memory_threshold: float | None = 0.98, ray_num_cpus: int | None = 1,
             stream: bool = True) -> dict:
    """Run ``cfg`` under ``flwr run`` with the local simulation (Ray) and return its timings.

    Writes the app (:func:`write_app`) and ``FLWR_HOME`` (:func:`write_flwr_home`) under ``cfg.out_dir``,
    starts a SuperLink of its own on free ports (``FLWR_HOME`` there, runtime dependency installation
    off, so no second torch is installed), runs ``flwr run APP local --federation-config
    num-supernodes=N --stream``, stops the SuperLink, and checks the result files (:func:`check_outcome`).
    ``num_supernodes`` defaults to ``num_clients`` (one node per partition). ``ray_memory_threshold``
    sets ``RAY_memory_usage_threshold`` (Ray counts other processes' memory too), None leaves it.
    ``ray_num_cpus``: the CPUs Ray may use, one per ClientApp actor (default 1: one actor serves every
    client in turn, and Ray starts one worker instead of one per core, which lets its start-up,
    limited to a fixed 30 s, pass on a loaded machine); None: Ray's default (all cores, 2 per actor).

    Returns ``{"wall_s", "superlink_start_s", "first_round_start_s", "round_seconds", "summary"}``:
    wall time of the whole command, the SuperLink's start-up, the time from launch to the ServerApp's
    first round (SuperLink, app build, Ray and ServerApp start-up) and each round's seconds.
    """
    import os
    import signal
    import subprocess
    import sys
    import threading

    from . import rundir

    check_supported(cfg)
    if not cfg.out_dir:
        raise FeddrKitError("out_dir: the flower command needs an out_dir (the app, FLWR_HOME and the results go there)")
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
        env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
               "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0",
               "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # flower-superexec
        if ray_memory_threshold is not None:
            env["RAY_memory_usage_threshold"] = str(ray_memory_threshold)
        # Ray's raylet gives its dashboard agent a few seconds to start; a loaded machine needs more
        env.setdefault("RAY_agent_register_timeout_ms", str(int(startup_timeout * 1000)))
        env.setdefault("RAY_raylet_start_wait_time_s", str(int(startup_timeout)))
        bin_dir = Path(sys.executable).parent
        logs = home / "local-superlink"
        logs.mkdir(parents=True, exist_ok=True)
        link_cmd = [str(bin_dir / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
                    "--disable-runtime-dependency-installation",
                    "--host", "127.0.0.1", "--port", str(http_port),
                    "--database", str(logs / "state.db"), "--log-file", str(logs / "superlink.log")]
        link = subprocess.Popen(link_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # its own process group: stopped with all it started
        previous = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():  # a SIGTERM still stops the SuperLink
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            _wait_healthy(http_port, link, startup_timeout)
            t_link = time.time()
            run_cmd = [str(bin_dir / "flwr"), "run", str(app), "local",
                       "--federation-config", f"num-supernodes={nodes}" + (
                           f" init-args-num-cpus={ray_num_cpus} client-resources-num-cpus=1" if ray_num_cpus else "")
                       ] + (["--stream"] if stream else [])
            done = subprocess.run(run_cmd, env=env, cwd=out_dir, timeout=timeout)
            if done.returncode != 0:
                raise FeddrKitError(f"flwr run exited with code {done.returncode}")
        finally:
            _stop(link)
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
        summary = check_outcome(cfg, out_dir)
        timing = json.loads((out_dir / TIMING).read_text()) if (out_dir / TIMING).exists() else {}
    result = {"wall_s": time.time() - t_launch, "superlink_start_s": t_link - t_launch,
              "first_round_start_s": timing.get("first_round_start", math.nan) - t_launch,
              "round_seconds": timing.get("round_seconds", []),
              "model_bytes": timing.get("model_bytes"), "summary": summary}
    return result


# --------------------------------------------------------------------------- chapter 09's figure
def message_flow_figure(num_shown: int = 2):
    """A sequence diagram of one run on Flower: who runs which kit function, and what each message
    carries (matplotlib Figure; ``num_shown`` SuperNodes are drawn)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 6.2))
    cols = {"server": 0.0, **{f"node{i}": 4.0 + 3.0 * i for i in range(num_shown)}}
    names = {"server": "ServerApp\n(KitStrategy)", **{f"node{i}": f"SuperNode, partition {i}\n(client_app)"
                                                      for i in range(num_shown)}}
    top, bottom = 10.0, 0.2
    for key, x in cols.items():
        ax.text(x, top + 0.35, names[key], ha="center", va="bottom", fontsize=10, weight="bold")
        ax.plot([x, x], [bottom, top], color="0.6", lw=1, ls="--", zorder=0)

    def arrow(y, src, dst, label, color):
        ax.annotate("", xy=(cols[dst], y), xytext=(cols[src], y),
                    arrowprops=dict(arrowstyle="->", color=color, lw=1.6))
        x = (cols[src] + cols[dst]) / 2
        ax.text(x, y + 0.12, label, ha="center", va="bottom", fontsize=8.5, color=color)

    def note(y, key, text):
        ax.text(cols[key] + 0.12, y, text, ha="left", va="center", fontsize=8.5, family="monospace",
                bbox=dict(boxstyle="round,pad=0.25", fc="0.95", ec="0.8"))

    note(9.6, "server", "prepare(cfg)  (same seed, same model)")
    arrow(9.0, "server", "node0", "query", "tab:gray")
    arrow(8.6, "node0", "server", "partition-id", "tab:gray")
    note(8.1, "server", "discover(): partition id -> node id")
    note(7.4, "server", "plan_round(t): sample_clients(seed, t)")
    for i in range(num_shown):
        arrow(6.8 - 0.35 * i, "server", f"node{i}", "train: global state + broadcast (c) + round, lr" if i == 0 else "",
              "tab:blue")
    for i in range(num_shown):
        note(5.6, f"node{i}", "prepare(cfg) once\ntrain_clients([ctx])\nc_i in context.state")
    for i in range(num_shown):
        arrow(4.3 - 0.35 * i, f"node{i}", "server", "reply: local state + loss, n + uploads (delta c)" if i == 0 else "",
              "tab:orange")
    note(3.2, "server", "accumulate() in sample order\nnext_global_state()")
    note(2.2, "server", "evaluate_global()  (central test set)\nsave_checkpoint()")
    ax.text(cols["server"] - 0.3, 0.9, "repeat for every round", fontsize=9, style="italic", color="0.35")
    ax.set_xlim(-0.8, max(cols.values()) + 2.6)
    ax.set_ylim(bottom, top + 1.3)
    ax.axis("off")
    return fig
