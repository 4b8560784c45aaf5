"""A sweep's grid: the configs it expands to (:func:`expand`) and each run's folder name (:func:`run_dir_name`).

A grid maps ``Config`` fields to lists of values; crossed with a list of seeds it gives one config per
point and seed. The folder name spells the point, so a sweep started again finds its runs by name.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..config import Config
from ..errors import FeddrKitError
from ..rundir import FORMER_DEFAULTS

# Fields that say where and how visibly a run goes, not what it computes: never part of a name,
# never a mismatch.
BOOKKEEPING = frozenset({"out_dir", "progress", "tensorboard", "overwrite", "device", "checkpoint_every"})
MAX_NAME = 120

# The teaching scale (``Config()``'s defaults: ``cnn_bn``, 120 rounds of 10 of 100 clients, 1 local epoch,
# chosen by the criteria in docs/teaching_scale.md), the scale of the results chapters' sweeps: a
# default run takes 3-4 minutes on 2 CPU cores. Read from ``Config`` so the two never disagree.
TEACHING_SCALE: dict[str, Any] = {k: getattr(Config(), k) for k in
                                  ("dataset", "model", "num_clients", "rounds", "clients_per_round", "local_epochs",
                                   "eval_every")}


def field_defaults() -> dict[str, Any]:
    """Every ``Config`` field with its default value."""
    out = {}
    for f in dataclasses.fields(Config):
        out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


def saved_defaults() -> dict[str, Any]:
    """Every ``Config`` field with the value that a saved record leaving it out (a ``sweep.json`` base, a
    ``point.json``, a ``config.json``) stands for: its default, or the former default of a field whose default
    changed (:data:`feddr_kit.rundir.FORMER_DEFAULTS`: such a record was written before the change)."""
    return {**field_defaults(), **FORMER_DEFAULTS}


def recorded_base(base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` as a sweep records it: with every field of :data:`feddr_kit.rundir.FORMER_DEFAULTS` it leaves out
    at today's default, written out, since a record that leaves such a field out reads as the former one
    (:func:`saved_defaults`). ``{"channels_last": None}`` (auto) joins a base that does not choose the layout."""
    defaults = field_defaults()
    return {**base, **{k: defaults[k] for k in FORMER_DEFAULTS if k not in base}}


def plain(v: Any) -> Any:
    """A JSON-comparable form of a config value (tuples as lists, NumPy scalars as Python ones)."""
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _value_text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(_value_text(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def name_from(items: Sequence[tuple[str, Any]]) -> str:
    """``k1=v1__k2=v2``: only ``[A-Za-z0-9._,+=-]``; a short SHA-1 of the items is appended when a
    character had to be replaced or the name is longer than ``MAX_NAME`` (so names stay distinct)."""
    raw = "__".join(f"{k}={_value_text(v)}" for k, v in items)
    safe = re.sub(r"[^A-Za-z0-9._,+=-]", "-", raw)
    if safe == raw and len(raw) <= MAX_NAME:
        return raw
    digest = hashlib.sha1(json.dumps([[k, plain(v)] for k, v in items]).encode()).hexdigest()[:10]
    return f"{safe[:MAX_NAME - 12]}__{digest}"


def check_grid(grid: Mapping[str, Sequence], seeds: Sequence[int]) -> None:
    """Raise :class:`FeddrKitError` naming the field unless ``grid`` maps names to non-empty lists of distinct
    values and ``seeds`` is a non-empty list of distinct integers >= 0."""
    if not isinstance(grid, Mapping):
        raise FeddrKitError(f"grid must be a dict field -> list of values, got {type(grid).__name__}")
    for name, values in grid.items():
        if not isinstance(values, (list, tuple)) or len(values) == 0:
            raise FeddrKitError(f"grid[{name!r}] must be a non-empty list of values, got {values!r}")
        texts = [json.dumps(plain(v), sort_keys=True) for v in values]
        dup = next((v for v, t in zip(values, texts) if texts.count(t) > 1), None)
        if dup is not None:
            raise FeddrKitError(f"grid[{name!r}] lists the value {dup!r} twice")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) == 0:
        raise FeddrKitError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise FeddrKitError(f"seeds must be integers >= 0, got {s!r}")
    if len(set(int(s) for s in seeds)) != len(seeds):
        raise FeddrKitError(f"seeds must be distinct, got {list(seeds)}")


def points(grid: Mapping[str, Sequence], seeds: Sequence[int]) -> list[tuple[dict, int]]:
    """Grid points × seeds, seeds outermost: after a third of a 3-seed sweep every cell has one seed."""
    names = list(grid)
    return [(dict(zip(names, combo)), int(s)) for s in seeds for combo in itertools.product(*(grid[n] for n in names))]


def expand(base: Mapping[str, Any] | Config, grid: Mapping[str, Sequence], seeds: Sequence[int]) -> list[Config]:
    """The sweep's configs: ``base`` updated with every combination of ``grid``'s values, for every seed.

    ``base``: Config fields (a dict or a ``Config``); ``grid``: field → non-empty list of values;
    ``seeds``: distinct integers. Order: seeds outermost, then the grid's fields in the order given
    (the first slowest). Every config is built and validated up front; a bad one raises
    ``FeddrKitError`` naming the grid point and the field. ``out_dir`` (set by the sweep) and ``seed``
    (given by ``seeds``) may not appear in ``base`` or ``grid``. Returns a list of ``len(seeds) · Π|values|`` configs.
    """
    base = base.to_dict() if isinstance(base, Config) else dict(base)
    check_grid(grid, seeds)
    allowed = set(field_defaults())
    for where, keys in (("base", base), ("grid", grid)):
        unknown = sorted(set(keys) - allowed)
        if unknown:
            raise FeddrKitError(f"{where} names unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
        if where == "grid" and "seed" in keys:
            raise FeddrKitError("grid may not hold 'seed': give the seeds as the seeds list")
    if base.get("out_dir") is not None:
        raise FeddrKitError("base may not set out_dir: the sweep puts each run in root/<name>/")
    base.pop("seed", None)
    base.pop("out_dir", None)
    configs = []
    for point, seed in points(grid, seeds):
        try:
            configs.append(Config.from_dict({**base, **point, "seed": seed}))
        except FeddrKitError as err:
            raise FeddrKitError(f"grid point {point} with seed {seed}: {err}") from None
    return configs


def run_dir_name(cfg: Config, base: Mapping[str, Any] | Config, grid: Iterable[str] = ()) -> str:
    """A readable, stable folder name for ``cfg`` within a sweep over ``base``.

    The fields named in ``grid`` (always, so ``algorithm=feddr+`` shows even when feddr+ is the
    default) and every other field whose value differs from ``base`` (fields missing from ``base``
    count at their ``Config`` default), in alphabetical order, then the seed:
    ``algorithm=feddr+__shards_per_client=5__seed=1``. Bookkeeping fields (out_dir, progress,
    device, checkpoint_every) never appear. Only ``[A-Za-z0-9._,+=-]`` are used; when other
    characters had to be replaced, or the name would pass 120 characters, a 10-hex-digit SHA-1 of
    the named fields is appended. A pure function of the values: the same in every process.
    Returns the name (a string).
    """
    ref = {**field_defaults(), **(base.to_dict() if isinstance(base, Config) else dict(base))}
    values, always = cfg.to_dict(), set(grid)
    named = [(k, values[k]) for k in sorted(values)
             if k not in BOOKKEEPING and k != "seed" and (k in always or plain(values[k]) != plain(ref.get(k)))]
    return name_from(named + [("seed", cfg.seed)])
