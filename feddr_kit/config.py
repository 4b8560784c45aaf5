"""``Config``: every setting of a federated run, with defaults at the CPU teaching scale.

The defaults are the teaching scale, the paper's protocol shrunk to two CPU cores and chosen by
measurement (``docs/teaching_scale.md``): real CIFAR-10, 100 clients with 5 shards each, 10 clients
per round for one local epoch, 120 rounds (evaluated every 20), and ``cnn_bn``, a small BatchNorm CNN whose features sit
at the paper's MobileNet's scale, so that FedDr+'s distillation term pulls as hard relative to DR as
it does in the paper. A default FedDr+ run takes about 4 minutes on 2 cores. Paper-scale values (the
paper's and its reference code's) are given in each field's help. Validation names the bad field and
what is allowed.

The methods' own settings (``mu``, ``tau``, ``fedexp_*``, ``scaffold_zero_head_grad``,
``fedrep_head_epochs``, ``ditto_lambda``, ``perfedavg_beta``, ``perfedavg_steps``, ``spherefed_calibration``) are fields
here too, each named after the method that reads it, rather than a per-method mapping. One flat
namespace of scalars is what everything that carries a config shares: the command line has one
``--flag`` per field, a Flower run config holds only flat bool/int/float/str values, a sweep grid
varies any field by name, and ``config.json`` / the checkpoint's config are compared field by field
when a run resumes. A method reads only its own fields, and every field is validated here with its
name, so a typo is an error and not a silently ignored key.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FeddrKitError

DATASETS = ("cifar10", "cifar100", "imagefolder", "synthetic")
PARTITIONS = ("shard", "dirichlet", "iid", "reference")
FEDEXP_STEPS = ("fedexp", "reference")
PERFEDAVG_STEPS = ("kit", "reference")
REGULARIZERS = ("none", "prox", "kd", "ntd", "ld", "fd")
DEVICES = ("auto", "cpu", "cuda")
ENGINES = ("auto", "serial", "batched")
PRECISIONS = ("fp32", "bf16")
# Fields whose None means "decided elsewhere" (regularizer: the algorithm's own; lr: its default for the
# model; partition_seed: seed; perfedavg_beta: the initial lr; channels_last: the layout measured faster for the
# run's engine and device, decided when the run is built); None passes their check.
OPTIONAL = ("regularizer", "lr", "partition_seed", "perfedavg_beta", "channels_last")
# Integer fields and their lowest value (num_clients and clients_per_round are checked in validate).
_INTEGERS = (("shards_per_client", 1), ("partition_seed", 0), ("rounds", 1), ("local_epochs", 1), ("batch_size", 1),
             ("eval_every", 1), ("probe_samples", 1), ("seed", 0), ("checkpoint_every", 0), ("fedrep_head_epochs", 0))
# Real fields: (name, low, high, low end open, high end open).
_REALS = (("alpha", 0.0, math.inf, True, False), ("beta", 0.0, 1.0, False, False), ("lr", 0.0, math.inf, True, False),
          ("lr_gamma", 0.0, 1.0, True, False), ("momentum", 0.0, 1.0, False, True),
          ("weight_decay", 0.0, math.inf, False, False), ("mu", 0.0, math.inf, False, False),
          ("tau", 0.0, math.inf, True, False), ("fedexp_eps", 0.0, math.inf, False, False),
          ("ditto_lambda", 0.0, math.inf, False, False), ("perfedavg_beta", 0.0, math.inf, True, False))


@dataclass
class Config:
    """One federated run. Every field has a default; ``help`` in the metadata documents it."""

    # data and partition
    dataset: str = field(default="cifar10", metadata={"help": "cifar10 | cifar100 | imagefolder | synthetic"})
    data_path: str | None = field(default=None, metadata={"help": "folder with train/ and test/ for dataset=imagefolder"})
    partition: str = field(default="shard", metadata={"help": "shard | dirichlet | iid | reference (the FedDr+ code's own partition files: see reference_partition)"})
    num_clients: int = field(default=100, metadata={"help": "number of clients K (paper: 100)"})
    shards_per_client: int = field(default=5, metadata={"help": "shards per client s for partition=shard, so at most s classes (paper CIFAR-10: 2, 5, 10)"})
    alpha: float = field(default=0.1, metadata={"help": "Dirichlet concentration for partition=dirichlet (paper: 0.1-0.3)"})
    partition_seed: int | None = field(default=None, metadata={"help": "seed of the partition; None uses seed"})
    reference_partition: str | None = field(default=None, metadata={"help": "for partition=reference: a file name such as cifar10_shard_s2 (in FEDDR_REFERENCE_DIR) or a path to an .npz"})
    # model and algorithm
    model: str = field(default="cnn_bn", metadata={"help": "cnn_bn (the teaching model) | cnn_nobn (cnn_bn without BatchNorm) | cnn | vgg11 | mobilenet (paper: vgg11 for CIFAR-10, mobilenet for CIFAR-100)"})
    algorithm: str = field(default="feddr+", metadata={"help": "fedavg | fedbabu | scaffold | fedntd | fedexp | spherefed | fedetf | dr | feddr+; personalized: fedper | fedrep | perfedavg | ditto"})
    regularizer: str | None = field(default=None, metadata={"help": "none (no regularizer) | prox | kd | ntd | ld | fd; None (flag left out) = the algorithm's own (fd for feddr+); a run records the one it used"})
    beta: float = field(default=0.9, metadata={"help": "weight of the algorithm's loss in beta*L_alg + (1-beta)*L_reg (paper: 0.9)"})
    # optimization
    rounds: int = field(default=120, metadata={"help": "communication rounds (paper: 320)"})
    clients_per_round: int = field(default=10, metadata={"help": "clients sampled per round (paper: 10 = 10%)"})
    local_epochs: int = field(default=1, metadata={"help": "local epochs E (paper: 10 on CIFAR-10, 3 on CIFAR-100)"})
    batch_size: int = field(default=50, metadata={"help": "local batch size (paper: 50)"})
    lr: float | None = field(default=None, metadata={"help": "initial local learning rate lr0; None = the algorithm's default for the model; may change on resume"})
    lr_decay_at: tuple[float, ...] = field(default=(0.5, 0.75), metadata={"help": "fractions of the rounds where the lr is multiplied by lr_gamma (a list; empty: constant lr)"})
    lr_gamma: float = field(default=0.1, metadata={"help": "lr decay factor"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum (reset for every client every round)"})
    weight_decay: float = field(default=1e-5, metadata={"help": "SGD weight decay"})
    # evaluation, probes, output
    eval_every: int = field(default=20, metadata={"help": "evaluate the global model every this many rounds (and at the last)"})
    probes: bool = field(default=False, metadata={"help": "record the paper's observed/unobserved probes at every evaluated round"})
    probe_samples: int = field(default=500, metadata={"help": "class-balanced test images used by the probes"})
    seed: int = field(default=0, metadata={"help": "seed of model init, client sampling and local batches"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    engine: str = field(default="auto", metadata={"help": "serial | batched | auto: how a round's clients train (auto: batched on CUDA, serial on CPU)"})
    deterministic: bool = field(default=True, metadata={"help": "deterministic kernels: same seed, same history, on CUDA too (False: faster nondeterministic kernels)"})
    precision: str = field(default="fp32", metadata={"help": "fp32 | bf16: bf16 copies of the fp32 weights for forward/backward (batched engine only)"})
    tf32: bool = field(default=True, metadata={"help": "CUDA: let float32 matmuls and convolutions run on TF32 tensor cores (10-bit mantissa); ignored on CPU, which has none"})
    channels_last: bool | None = field(default=None, metadata={"help": "lay out the images and the conv weights channels-last (NHWC), both engines: the same arithmetic in another memory order and summation order. Default auto (None in Python): channels-last for the serial engine on the CPU, where it was measured faster (benchmarks/cpu_step.py), contiguous (NCHW) elsewhere (a GPU, the batched engine: unmeasured; True tries channels-last there). A run records the layout it used; a resume left at auto continues it"})
    fused_sgd: bool = field(default=False, metadata={"help": "batched engine: one fused SGD kernel over the stacked parameters at the steps where every client trains (else foreach ops)"})
    out_dir: str | None = field(default=None, metadata={"help": "folder for config.json, history.csv, summary.json, checkpoint.pt, owned by one run at a time; left out: nothing is saved"})
    overwrite: bool = field(default=False, metadata={"help": "let a fresh run replace the results already in out_dir (without it, such a run is refused)"})
    checkpoint_every: int = field(default=5, metadata={"help": "rounds between checkpoints when out_dir is set (0: only at the end)"})
    progress: bool = field(default=True, metadata={"help": "show progress: a bar in a terminal or live notebook, plain-text lines under papermill or in a log (FEDDR_PROGRESS=lines|bars|widgets sets it)"})
    tensorboard: bool = field(default=False, metadata={"help": "also log each evaluated round's metrics and the config to out_dir/tb/ for TensorBoard (needs pip install tensorboard)"})
    # algorithm hyper-parameters (used by the methods that need them)
    mu: float = field(default=1e-3, metadata={"help": "prox: weight mu of (mu/2)||theta - theta_g||^2"})
    tau: float = field(default=1.0, metadata={"help": "kd / ntd temperature"})
    fedexp_eps: float = field(default=1e-3, metadata={"help": "FedExP epsilon (decayed by 0.998^2 per round with fedexp_step=fedexp)"})
    fedexp_step: str = field(default="fedexp", metadata={"help": "fedexp (the FedExP paper's extrapolating step) | reference (the FedDr+ code's step, which never extrapolates: the paper's FedExP numbers)"})
    scaffold_zero_head_grad: bool = field(default=False, metadata={"help": "SCAFFOLD: zero the head weight's loss gradient before the control-variate correction, as the FedDr+ code"})
    fedrep_head_epochs: int = field(default=10, metadata={"help": "FedRep: head-only epochs before the local_epochs body-only epochs (FedRep's CIFAR-10 code: 10)"})
    ditto_lambda: float = field(default=0.75, metadata={"help": "Ditto: weight lambda of the proximal term (lambda/2)||v - w||^2 of the personal model (FedBABU code: 0.75)"})
    perfedavg_beta: float | None = field(default=None, metadata={"help": "Per-FedAvg: outer step size beta; None = the run's initial lr (the reference's fixed 0.1 = its lr0)"})
    perfedavg_steps: str = field(default="kit", metadata={"help": "Per-FedAvg batches per visit: kit (the kit's local rule, E*nb batches, so E*nb/2 (D, D') pairs; nb batches per epoch) | reference (E*(nb//E + 1) pairs, as the FedBABU / FedDr+ code; with weight_decay=0 it is that code's step)"})
    spherefed_calibration: bool = field(default=False, metadata={"help": "SphereFed closed-form head calibration after training"})

    def __post_init__(self) -> None:
        for f in fields(self):  # NumPy scalars (np.int64(10), np.float32(0.1)) as the Python numbers they are
            v = getattr(self, f.name)
            if isinstance(v, np.generic):
                setattr(self, f.name, v.item())
        if isinstance(self.lr_decay_at, (list, tuple, np.ndarray)):
            self.lr_decay_at = tuple(v.item() if isinstance(v, np.generic) else v for v in self.lr_decay_at)
        for name in ("out_dir", "data_path"):
            if isinstance(getattr(self, name), os.PathLike):
                setattr(self, name, os.fspath(getattr(self, name)))
        self.validate()

    # ---------------------------------------------------------------- validation
    def validate(self) -> "Config":
        """Check every field; raise ``FeddrKitError`` naming the first bad one and the allowed values."""
        from .methods import ALGORITHMS
        from .models import MODELS

        for name, allowed in (("dataset", DATASETS), ("partition", PARTITIONS), ("model", MODELS),
                              ("algorithm", tuple(ALGORITHMS)), ("regularizer", REGULARIZERS), ("device", DEVICES),
                              ("engine", ENGINES), ("precision", PRECISIONS), ("fedexp_step", FEDEXP_STEPS),
                              ("perfedavg_steps", PERFEDAVG_STEPS)):
            self._choice(name, allowed)
        for name in ("deterministic", "tf32", "fused_sgd", "probes", "progress", "tensorboard",
                     "overwrite", "scaffold_zero_head_grad", "spherefed_calibration"):
            if not isinstance(getattr(self, name), bool):
                raise FeddrKitError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.channels_last is not None and not isinstance(self.channels_last, bool):
            raise FeddrKitError(f"channels_last must be True, False or None (auto: channels-last for the serial engine "
                                f"on the CPU; auto in a config file or on the command line), got {self.channels_last!r}")
        for name in ("data_path", "out_dir"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise FeddrKitError(f"{name} must be a folder path (str or os.PathLike) or None, got {getattr(self, name)!r}")
        if self.dataset == "imagefolder" and not self.data_path:
            raise FeddrKitError("data_path must name a folder with train/ and test/ when dataset='imagefolder'")
        if (self.partition == "reference" or self.reference_partition is not None) and not (
                isinstance(self.reference_partition, str) and self.reference_partition):
            raise FeddrKitError("reference_partition must name a reference partition file (e.g. 'cifar10_shard_s2') "
                                f"or a path to one, for partition='reference'; got {self.reference_partition!r}")
        self._integer("num_clients", 1)  # first: clients_per_round is checked against it
        for name, low in _INTEGERS:
            self._integer(name, low)
        self._integer("clients_per_round", 1, self.num_clients)
        for name, low, high, low_open, high_open in _REALS:
            self._real(name, low, high, low_open, high_open)
        if not isinstance(self.lr_decay_at, tuple) or not all(
                isinstance(f, numbers.Real) and not isinstance(f, bool) and 0 < f < 1 for f in self.lr_decay_at):
            raise FeddrKitError(f"lr_decay_at must be a list of fractions strictly between 0 and 1 "
                                f"(e.g. [0.5, 0.75]; [] for a constant lr), got {self.lr_decay_at!r}")
        return self

    def _choice(self, name: str, allowed: tuple) -> None:
        value = getattr(self, name)
        if value not in allowed and not (value is None and name in OPTIONAL):
            raise FeddrKitError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")

    def _integer(self, name: str, low: int, high: float = math.inf) -> None:
        v = getattr(self, name)
        if v is None and name in OPTIONAL:
            return
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            rng = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
            raise FeddrKitError(f"{name} must be an integer {rng}, got {v!r}")

    def _real(self, name: str, low: float, high: float, low_open: bool, high_open: bool) -> None:
        v = getattr(self, name)
        if v is None and name in OPTIONAL:
            return
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
        if not (ok and (low < v if low_open else low <= v) and (v < high if high_open else v <= high)):
            if high == math.inf:
                rng = f"a finite number {'>' if low_open else '>='} {low:g}"
            else:
                rng = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise FeddrKitError(f"{name} must be {rng}, got {v!r}")

    # ---------------------------------------------------------------- conversions
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of all fields."""
        d = dataclasses.asdict(self)
        d["lr_decay_at"] = list(self.lr_decay_at)
        return d

    def to_json(self) -> str:
        """The config as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        """Build a config from a dict; unknown keys are an error naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise FeddrKitError(f"unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
        return cls(**d)

    @classmethod
    def from_saved(cls, values: Any, path: str | os.PathLike, who: str) -> "Config":
        """The Config that ``values``, the JSON object read from the saved file ``path`` (a run's
        ``config.json``, an export's ``model.json``), describes; a one-line ``FeddrKitError`` that names
        ``who`` and the file when it describes none (not an object, unknown fields, a bad value)."""
        if not isinstance(values, dict):
            raise FeddrKitError(f"{who}: {path} holds no config (not a JSON object)")
        try:
            return cls.from_dict(values)
        except FeddrKitError as err:
            raise FeddrKitError(f"{who}: {path}: {err}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Config":
        """Build a config from a YAML or JSON file of fields (:func:`read_file`), e.g. a run's own ``config.json``."""
        return cls.from_dict(read_file(path))

    def replace(self, **changes: Any) -> "Config":
        """A copy with some fields changed (validated)."""
        return Config.from_dict({**self.to_dict(), **changes})


def read_mapping(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """The mapping a ``.json``, ``.yaml`` or ``.yml`` file holds; one-line ``FeddrKitError`` when the file
    is missing, unreadable, of another kind or not a mapping, or when a mapping in it gives a key twice (which
    both parsers would take silently, keeping the last). ``what`` names the file in the errors."""
    path = Path(path)
    if not path.is_file():
        raise FeddrKitError(f"{what}: {path} is not a file")
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise FeddrKitError(f"{what}: {path} must end in .json, .yaml or .yml")
    try:
        text = path.read_text()
        value = json.loads(text, object_pairs_hook=_unique_keys) if suffix == ".json" else _yaml_load(text)
    except DuplicateKeyError as err:
        raise FeddrKitError(f"{what}: {path} gives {err.key!r} twice (which one is meant?); give it once") from None
    except Exception as err:  # a syntax error of either parser, or an unreadable file: one line either way
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FeddrKitError(f"{what}: cannot read {path} ({type(err).__name__}: {first})") from None
    if not isinstance(value, dict):
        raise FeddrKitError(f"{what}: {path} must hold a mapping of names to values, got {type(value).__name__}")
    return value


class DuplicateKeyError(ValueError):
    """A mapping in a config file names ``key`` twice (both parsers would silently keep the last)."""

    def __init__(self, key: Any):
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, or :class:`DuplicateKeyError` for a name given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def _yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that raises :class:`DuplicateKeyError` for a key given twice in one mapping: a file that
    sets ``lr`` twice is a mistake to show, not a choice to make silently."""
    import yaml  # PyYAML, a dependency of the kit (and of papermill)

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden: that is its use
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, typing.Hashable):
                    if key in seen:
                        raise DuplicateKeyError(key)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader)


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """The Config fields a YAML or JSON config file sets (not validated together: a file may set only a
    few, and flags may complete it). Unknown names are an error naming them and the file.

    A file is read as the command line reads its flags: a number written as text is that number for a
    numeric field (PyYAML reads ``lr: 1e-3`` as the string ``"1e-3"``: YAML 1.1 floats need a dot), and
    ``out_dir: none`` is refused like ``--out-dir none`` (:func:`is_none_word`), not taken as a folder;
    ``channels_last: auto`` is None (auto) like ``--channels-last auto``.
    For an integer field a whole number is that integer however it is written (``rounds: 1.0``, ``"1.0"``,
    ``1e1``, JSON's ``1.0``): whether a parser hands over text or a float depends on the spelling alone
    (YAML reads ``1e1`` as text and ``1.0e1`` as a float), and programs that write config files often write
    every number as a float, so the same value must not be taken or refused by its spelling. A fraction
    (``rounds: 2.5``) is refused, as ``--rounds 2.5`` is.
    """
    values = read_mapping(path)
    unknown = sorted(set(values) - {f.name for f in fields(Config)})
    if unknown:
        raise FeddrKitError(f"config file {path}: unknown field(s) {', '.join(map(str, unknown))}; "
                            "allowed: the Config fields (python -m feddr_kit run --help lists them)")
    if is_none_word(values.get("out_dir")):
        raise FeddrKitError(f"config file {path}: out_dir: {values['out_dir']!r} is not taken as a folder name: "
                            "leave out_dir out (or null) to save nothing, or write ./none for a folder called none")
    return {name: _numbers_from_text(name, _auto_word(name, value)) for name, value in values.items()}


def _auto_word(name: str, value: Any) -> Any:
    """None for the word auto or none (any case) given to a ``bool | None`` field (``channels_last: auto``), as
    the command line reads ``--channels-last auto``; any other value unchanged."""
    hint = str(_HINTS[name])
    if "bool" in hint and "None" in hint and isinstance(value, str) and value.strip().lower() in ("auto", "none"):
        return None
    return value


def is_none_word(value: Any) -> bool:
    """Whether ``value`` is the word none (any case), which the command line and config files never take
    as the folder name ``out_dir``: a user who writes it means "no folder"."""
    return isinstance(value, str) and value.strip().lower() == "none"


def _number_kind(name: str) -> type | None:
    """``int`` or ``float`` for a numeric field (a tuple field: of its items), else None."""
    hint = str(_HINTS[name])
    if "bool" in hint:
        return None
    return float if "float" in hint else int if "int" in hint else None


def _numbers_from_text(name: str, value: Any) -> Any:
    """``value`` for field ``name`` with numbers written as text (``"1e-3"``, ``"20"``, in a list too) turned into
    the field's kind, ``int`` or ``float``; anything else is left for validation to name."""
    kind = _number_kind(name)
    if kind is None:
        return value
    if isinstance(value, list):
        return [_number(item, kind) for item in value]
    return _number(value, kind)


def whole_number(text: str) -> int:
    """An integer typed as text, read as a config file reads it: ``"20"``, ``"1e3"`` and ``"1.0"`` give 20, 1000
    and 1; anything else (``"2.5"``, ``"ten"``) raises ``ValueError``."""
    value = _number(text, int)
    if not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {text!r}")
    return value


def _number(value: Any, kind: type) -> Any:
    """``value`` as a number of ``kind`` when it is one: text that reads as a number, or (for ``int``) a
    whole-number float; anything else unchanged, for validation to name (see :func:`read_file`)."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
    elif isinstance(value, float):
        number = value
    else:  # ints, bools (never numbers here), None, lists of lists: validation's to judge
        return value
    if kind is int:  # "20", "1e3", 1.0 and "1.0" are integers; 2.5 and "2.5" stay, for validation to refuse
        return int(number) if number.is_integer() else value
    return number


_HINTS = typing.get_type_hints(Config)
