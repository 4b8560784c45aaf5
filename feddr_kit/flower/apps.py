"""The kit's algorithms on Flower (flwr 1.42, Message API), from the same code as :func:`feddr_kit.run`.

``client_app`` (a :class:`flwr.clientapp.ClientApp`) trains one client from the global state it
receives; ``server_app`` (a :class:`flwr.serverapp.ServerApp`) runs :class:`KitStrategy`. Both are
message codecs over the pieces ``fk.run`` is made of: the client decodes a train message, trains with
:func:`feddr_kit.federated.train_clients` on the run that :func:`feddr_kit.build.build_run` builds,
and encodes its reply; the strategy plans with :func:`feddr_kit.schedule.plan_round`, decodes the
replies into a :class:`feddr_kit.federated.Aggregate` in the plan's order, and keeps the run's record
with the same :class:`feddr_kit.roundlog.RoundLog`. So no algorithm has a second implementation and,
on CPU with ``engine="serial"``, a Flower run's history, weights, ``config.json`` and ``summary.json``
equal ``fk.run``'s.

What crosses the wire, per round and sampled client:

- server → client (``train``): ``"global"`` the global state (:class:`~flwr.app.ArrayRecord`),
  ``"broadcast"`` the algorithm's extras (``Algorithm.broadcast``, SCAFFOLD's ``c``), ``"config"``
  the round, lr, whether the round is measured and the partition id the message is for;
- client → server: ``"state"`` its final local state, ``"metrics"`` partition id, number of
  examples, mean local loss, the scalar uploads and the instruments' sums (``GRADIENTS``), and one
  ArrayRecord ``"upload.<key>"`` per tensor upload (``Algorithm.uploads`` types them).

A client's persistent state (``Algorithm.client_state``, SCAFFOLD's ``c_i``) lives in the
client's ``context.state``; the algorithm object that trains it is made afresh for every message,
because one simulation actor serves many clients. Clients are sampled by the kit's
:func:`~feddr_kit.streams.sample_clients` over partition ids (learned once with a ``query``
message), not by Flower's sampler, and the replies are summed in the sample's order. The server
evaluates the global model centrally on the test set (``configure_evaluate`` sends nothing).

Not supported here: ``probes=True``, ``resume`` and ``engine="batched"`` (clients train one per
message). SphereFed's calibration reads every client's training images on the server, as
``fk.run`` does (a shortcut a real deployment would replace by uploaded ``G_k``, ``B_k``).
``flwr run`` itself (the App's files, the SuperLink, :func:`~feddr_kit.flower.launch.simulate`,
:func:`~feddr_kit.flower.launch.deploy`) is in :mod:`feddr_kit.flower.launch`.

Needs ``pip install 'feddr_kit[flower]'``; ``import feddr_kit`` never imports this module, and
:mod:`feddr_kit.flower` imports it at the first use of one of its names.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from .. import engine as engine_mod
from .. import federated as fed
from .. import instruments
from ..build import Run, build_run
from ..config import Config
from ..data import ImageData
from ..errors import FeddrKitError
from ..partition import Partition
from ..roundlog import Result, RoundLog
from ..rundir import write_json
from ..schedule import RoundPlan, plan_round
from .launch import TIMING, check_supported, config_from_run_config, config_to_run_config

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
_SETUPS: dict[str, Run] = {}  # one per process (a simulation actor serves many clients)
_DATA: dict[tuple, ImageData] = {}


def client_setup(cfg: Config) -> Run:
    """The process's :class:`~feddr_kit.build.Run` for ``cfg`` (data, partition, models), built once and
    reused by every message; a fresh algorithm replaces its ``algo`` per message."""
    key = cfg.to_json()
    if key not in _SETUPS:
        _SETUPS.clear()
        data = _DATA.get((cfg.dataset, cfg.data_path))
        _SETUPS[key] = build_run(cfg, engine_mod.resolve_device(cfg.device), data)
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
    conf = msg.content["config"]
    # the server's layout, not this node's auto choice: the server records it, and a GPU node beside a CPU
    # server would otherwise train in another memory order than the run says
    cfg = config_from_run_config(dict(context.run_config)).replace(channels_last=bool(conf["channels-last"]))
    client = int(context.node_config[PARTITION_ID])
    if int(conf["client"]) != client:
        raise FeddrKitError(f"a train message for partition {conf['client']} reached the node of partition {client}")
    setup = client_setup(cfg)
    with engine_mod.kernel_settings(cfg.deterministic, setup.device, cfg.tf32):
        algo = setup.renew_algorithm()  # afresh: no state of another client can leak in
        global_state = from_record(msg.content["global"], setup.device)
        algo.receive_broadcast(from_record(msg.content["broadcast"], setup.device))
        own = context.state[CLIENT_STATE] if CLIENT_STATE in context.state else ArrayRecord()
        algo.set_client_state(client, from_record(own, setup.device))
        if algo.needs_teacher:
            fed.load_teacher(setup, global_state)
        ctx = setup.context(client, int(conf["round"]), float(conf["lr"]), global_state, measure=bool(conf["measure"]))
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
    """The kit's round on Flower's :meth:`Strategy.start` loop, as a message codec: the kit's sampling over
    partition ids, the replies aggregated in the sample's order, and the run's record (central evaluation,
    timing, history, callback, checkpoints) kept by a :class:`~feddr_kit.roundlog.RoundLog`.

    ``log``: the run's record (default: a fresh one over ``setup``, ``out_dir`` and ``callback``). After
    :meth:`start`, ``global_state``, ``rows`` (the history) and ``round_seconds`` hold the run.
    """

    def __init__(self, setup: Run, out_dir: Path | None = None, callback: Callable[[dict], None] | None = None,
                 log: RoundLog | None = None):
        self.setup = setup
        self.cfg = setup.cfg
        self.log = log if log is not None else RoundLog(setup, out_dir, callback)
        self.global_state = self.log.start_state
        self.nodes: dict[int, int] = {}  # partition id -> node id
        self.plan: RoundPlan | None = None
        self.gathered: fed.Aggregate | None = None
        self.first_round_start: float | None = None  # wall-clock time (time.time()) round 1 began

    @property
    def rows(self) -> list[dict]:
        """The history rows so far."""
        return self.log.rows

    @property
    def round_seconds(self) -> list[float]:
        """Every round's seconds so far."""
        return self.log.round_seconds

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
        """Plan the round and encode one train message per sampled client."""
        self.log.start_round()
        if self.first_round_start is None:
            self.first_round_start = time.time()
        self.plan = plan_round(self.cfg, self.setup.lr0, server_round - 1, self.setup.partition)
        broadcast = to_record(self.setup.algo.broadcast())
        return [Message(RecordDict({"global": arrays, "broadcast": broadcast,
                                    "config": ConfigRecord({"round": self.plan.round, "lr": self.plan.lr, "client": k,
                                                            "measure": self.plan.evaluating,
                                                            "channels-last": bool(self.cfg.channels_last)})}),
                        dst_node_id=self.nodes[k], message_type=MessageType.TRAIN, group_id=str(server_round))
                for k in self.plan.clients]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Decode the replies into the round's :class:`~feddr_kit.federated.Aggregate`, in the plan's order,
        and take the next global state."""
        plan, setup = self.plan, self.setup
        by_client = {}
        for r in replies:
            if r.has_error():
                raise FeddrKitError(f"round {server_round}: node {r.metadata.src_node_id} failed: {r.error.reason}")
            by_client[int(r.content["metrics"][PARTITION_ID])] = r.content
        missing = sorted(set(plan.clients) - set(by_client))
        if missing:
            raise FeddrKitError(f"round {server_round}: no reply from client(s) {missing}")
        self.gathered = gathered = fed.Aggregate(self.global_state)
        for k, w in zip(plan.clients, plan.weights):  # the sample's order: the kit's float sums
            content = by_client[k]
            state = from_record(content["state"], setup.device)
            sums = {key[len(GRADIENTS):]: v for key, v in content["metrics"].items() if key.startswith(GRADIENTS)}
            gathered.add([state[n] for n in gathered.average], w, float(content["metrics"]["train-loss"]),
                         unpack_uploads(setup.algo, content, setup.device),
                         instruments.GradientRatios.from_floats(sums) if sums else None)
        self.global_state = gathered.next_global_state(setup, plan)
        return to_record(self.global_state), MetricRecord({"train_loss": float(np.mean(gathered.losses))})

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
        """``evaluate_fn`` of :meth:`Strategy.start`, called after each round's aggregation: the round ends in
        the run's record (:meth:`RoundLog.end_round`: evaluation on evaluated rounds, timing, checkpoint)."""
        if server_round == 0:
            return None
        row = self.log.end_round(self.plan, self.global_state, self.gathered.losses, self.gathered.gradients)
        return None if row is None else MetricRecord({k: float(v) for k, v in row.items()})


def run_on_grid(grid: Grid, cfg: Config, data: ImageData | None = None, partition: Partition | None = None,
                callback: Callable[[dict], None] | None = None, timeout: float = 3600.0) -> Result:
    """Run ``cfg`` as the ServerApp does, over ``grid`` (Flower's, or :class:`InProcessGrid`); returns the
    same :class:`~feddr_kit.roundlog.Result` as ``fk.run``. Writes config.json, history.csv,
    checkpoint.pt and summary.json to ``cfg.out_dir`` when set (the folder is not claimed here: the
    process that started the ServerApp, :func:`simulate`, owns it)."""
    check_supported(cfg)
    with fed.open_run(cfg, data=data, partition=partition, callback=callback, claim=False) as log:
        strategy = KitStrategy(log.setup, log=log)
        strategy.discover(grid, timeout=min(timeout, 600.0))
        strategy.start(grid, to_record(log.setup.initial_state), num_rounds=cfg.rounds, timeout=timeout,
                       evaluate_fn=strategy.evaluate)
        result = log.finish(strategy.global_state)
    if log.out_dir is not None:  # for simulate(): when the rounds ran, seen from the ServerApp
        write_json(log.out_dir / TIMING, {"first_round_start": strategy.first_round_start,
                                          "round_seconds": strategy.round_seconds,
                                          "model_bytes": sum(v.numel() * v.element_size() for v in strategy.global_state.values())})
    return result


server_app = ServerApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """The ServerApp: the run the app's run config (the Config fields) describes."""
    cfg = config_from_run_config(dict(context.run_config))
    result = run_on_grid(grid, cfg)
    s = result.summary  # worded as `python -m feddr_kit run` words it, accuracies in percent
    print(f"feddr_kit on Flower: {cfg.algorithm} on {cfg.dataset} ({cfg.partition}): final accuracy {s['final_acc']:.2%}, "
          f"best {s['best_acc']:.2%}, {s['sec_per_round']:.1f} s per round")


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
                   callback: Callable[[dict], None] | None = None, quiet: bool = True) -> Result:
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
