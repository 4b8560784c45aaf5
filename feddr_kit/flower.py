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

import logging
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from . import engine as engine_mod
from . import federated as fed
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
        ctx = fed.client_context(setup, client, int(conf["round"]), float(conf["lr"]), global_state)
        [(ctx, loss, upload)] = list(fed.train_clients(setup, [ctx], engine="serial"))
        context.state[CLIENT_STATE] = to_record(algo.client_state(client))
        scalars, arrays = pack_uploads(algo, upload)
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
        self._t0 = 0.0

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
        self.plan = fed.plan_round(self.cfg, self.setup.lr0, t, self.setup.partition)
        broadcast = to_record(self.setup.algo.broadcast())
        return [Message(RecordDict({"global": arrays, "broadcast": broadcast,
                                    "config": ConfigRecord({"round": t, "lr": self.plan.lr, "client": k})}),
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
        uploads, self.losses = [], []
        for k, w in zip(plan.clients, plan.weights):  # the sample's order: the kit's float sums
            content = by_client[k]
            state = from_record(content["state"], setup.device)
            fed.accumulate(average, [state[n] for n in average], w)
            uploads.append(unpack_uploads(setup.algo, content, setup.device))
            self.losses.append(float(content["metrics"]["train-loss"]))
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
        print(f"feddr_kit {self.cfg.algorithm}: {self.cfg.num_clients} clients, {self.cfg.clients_per_round} per round, "
              f"{self.cfg.rounds} rounds")

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """``evaluate_fn`` of :meth:`Strategy.start`: the kit's evaluation (on evaluated rounds), the round's
        seconds, and the checkpoint."""
        if server_round == 0:
            return None
        plan = self.plan
        row = None
        if plan.evaluating:
            row = fed.evaluate_global(self.setup, self.evaluator, self.global_state, plan, self.losses)
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
        return fed.finish_run(setup, strategy.global_state, strategy.rows, strategy.round_seconds, out_dir)


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

