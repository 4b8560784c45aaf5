"""Golden histories: what every algorithm, personalization and chapter computation produces, bit for bit.

Each case below is a tiny CPU run (synthetic data, one torch thread, fixed seed). :func:`record` turns
its result into plain JSON: the history without its wall-clock ``seconds`` column, the summary without
its timings, and a SHA-256 of every tensor of the final model (dtype, shape and bytes). The records are
stored in ``tests/golden_history.json``; ``tests/test_golden.py`` recomputes every case and requires
the same record, so a change meant to keep the numbers (a refactor) is checked to keep them exactly.

Regenerate the file only when a change is MEANT to change the numbers, and say so in its commit::

    PYTHONPATH=. python tests/golden.py            # every case
    PYTHONPATH=. python tests/golden.py fedavg     # some cases (the others are kept)

Every Config field that affects the numbers is given explicitly (:data:`BASE`), so a change of a
Config default does not change a record. Two things are still taken from the kit as it stands: the
model builders (``model="cnn"`` / ``"mobilenet"``) and, for the ``teaching`` case only, the Config
defaults that ``teaching.local_round_probes`` itself relies on (batch size, momentum, weight decay).
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

import feddr_kit as fk

PATH = Path(__file__).with_name("golden_history.json")
TIMINGS = ("sec_per_round", "total_seconds")  # summary fields that are wall-clock times

# Every field that changes the numbers, at an explicit value (not Config's default).
BASE = dict(
    dataset="synthetic", partition="shard", num_clients=10, shards_per_client=2, alpha=0.3, partition_seed=None,
    model="cnn", regularizer=None, beta=0.9, rounds=2, clients_per_round=3, local_epochs=1, batch_size=8, lr=0.05,
    lr_decay_at=(0.5, 0.75), lr_gamma=0.1, momentum=0.9, weight_decay=1e-5, eval_every=1, probes=False,
    probe_samples=100, seed=3, device="cpu", engine="serial", deterministic=True, precision="fp32", progress=False,
    checkpoint_every=0, mu=1e-3, tau=1.0, fedexp_eps=1e-3, fedexp_step="fedexp", scaffold_zero_head_grad=False,
    fedrep_head_epochs=1, ditto_lambda=0.75, perfedavg_beta=None, perfedavg_steps="kit", spherefed_calibration=False,
)
GLOBAL = ["fedavg", "fedbabu", "scaffold", "fedntd", "fedexp", "spherefed", "fedetf", "dr", "feddr+"]
PERSONALIZED = ["fedper", "fedrep", "perfedavg", "ditto"]


def config(**changes: Any) -> fk.Config:
    """The tiny config with ``changes``."""
    return fk.Config(**{**BASE, **changes})


_DATA: dict[str, fk.data.ImageData] = {}


def data(kind: str = "cnn") -> fk.data.ImageData:
    """The synthetic data of the cases: 200 training and 100 test images, 32x32 (17x17 for mobilenet)."""
    if kind not in _DATA:
        size = 17 if kind == "mobilenet" else 32
        _DATA[kind] = fk.data.synthetic(num_classes=10, train_per_class=20, test_per_class=10, image_size=size)
    return _DATA[kind]


def run(**changes: Any) -> fk.Result:
    """``fk.run`` of the tiny config with ``changes``."""
    cfg = config(**changes)
    return fk.run(cfg, data=data(cfg.model))


# --------------------------------------------------------------------------- plain JSON of results
def table(df: pd.DataFrame) -> dict:
    """A DataFrame as ``{"columns": [...], "rows": [[...], ...]}`` of plain Python values."""
    return {"columns": [str(c) for c in df.columns], "rows": [[_plain(v) for v in row] for row in df.itertuples(index=False)]}


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def digests(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """SHA-256 of each tensor's dtype, shape and bytes, by name (in ``state``'s order)."""
    out = {}
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
        out[name] = h.hexdigest()
    return out


def run_record(result: fk.Result) -> dict:
    """What a federated run's result is pinned by."""
    summary = {k: v for k, v in result.summary.items() if k not in TIMINGS}
    return {"history": table(result.history.drop(columns="seconds")), "summary": _plain(summary),
            "weights": digests(result.model.state_dict())}


def personal_record(res) -> dict:
    """What a :class:`feddr_kit.personalize.PersonalResult` is pinned by."""
    return {"method": res.method, "per_client": table(res.per_client), "info": _plain(res.info)}


# --------------------------------------------------------------------------- the cases
def _finetune(algorithm: str, **kw: Any) -> dict:
    result = run(algorithm=algorithm)
    return personal_record(fk.personalize.finetune(result, epochs=1, batch_size=8, data=result.data,
                                                   partition=result.partition, **kw))


def _local_only(loss: str) -> dict:
    return personal_record(fk.personalize.local_only(config(algorithm="fedavg"), loss, epochs=1, data=data()))


def _teaching() -> dict:
    from feddr_kit import teaching

    result = run(algorithm="dr")
    df = teaching.local_round_probes(result.model, result.data, result.partition, {"CE": "fedavg", "DR": "dr",
                                                                                    "FedDr+": "feddr+"},
                                     round=2, clients_per_round=2, local_epochs=1, probe_samples=100, seed=3,
                                     lr={"fedavg": 0.05, "dr": 0.05, "feddr+": 0.05})
    return {"probes": table(df)}


CASES: dict[str, Callable[[], dict]] = {
    **{a: (lambda a=a: run_record(run(algorithm=a))) for a in GLOBAL + PERSONALIZED},
    **{f"fedavg+{r}": (lambda r=r: run_record(run(algorithm="fedavg", regularizer=r))) for r in ("prox", "kd", "ntd", "ld")},
    "feddr+ without fd": lambda: run_record(run(algorithm="feddr+", regularizer="none")),
    "fedexp reference step": lambda: run_record(run(algorithm="fedexp", fedexp_step="reference")),
    "scaffold zero head grad": lambda: run_record(run(algorithm="scaffold", scaffold_zero_head_grad=True)),
    "spherefed calibration": lambda: run_record(run(algorithm="spherefed", spherefed_calibration=True)),
    "ditto lambda 0.5": lambda: run_record(run(algorithm="ditto", ditto_lambda=0.5)),
    "perfedavg beta 0.02": lambda: run_record(run(algorithm="perfedavg", perfedavg_beta=0.02)),
    "fedrep 2 head epochs": lambda: run_record(run(algorithm="fedrep", fedrep_head_epochs=2)),
    "fedavg dirichlet": lambda: run_record(run(algorithm="fedavg", partition="dirichlet")),
    "feddr+ probes": lambda: run_record(run(algorithm="feddr+", probes=True)),
    "fedavg mobilenet": lambda: run_record(run(algorithm="fedavg", model="mobilenet")),
    "perfedavg mobilenet": lambda: run_record(run(algorithm="perfedavg", model="mobilenet")),
    **{f"{a} batched": (lambda a=a: run_record(run(algorithm=a, engine="batched")))
       for a in ("fedavg", "scaffold", "feddr+", "fedetf")},
    "fedavg+prox batched": lambda: run_record(run(algorithm="fedavg", regularizer="prox", engine="batched")),
    "finetune fedavg": lambda: _finetune("fedavg"),
    "finetune fedbabu": lambda: _finetune("fedbabu"),
    "finetune feddr+": lambda: _finetune("feddr+"),
    "finetune feddr+ as dr, head trained": lambda: _finetune("feddr+", method="dr", train_head=True, lr=0.02),
    "finetune fedetf protocol": lambda: _finetune("fedetf", protocol="fedetf", fedetf_alternations=1),
    **{f"local-only {loss}": (lambda loss=loss: _local_only(loss)) for loss in ("ce", "ce_etf", "dr")},
    "teaching local round probes": _teaching,
}


def compute(name: str) -> dict:
    """The record of case ``name``, computed now with one torch thread (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return json.loads(json.dumps(CASES[name]()))  # exactly what the file holds (tuples as lists)
    finally:
        torch.set_num_threads(threads)


def load() -> dict:
    """The stored records, by case name."""
    return json.loads(PATH.read_text())


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two records first differ (floats compared bit for bit, NaN equal to NaN), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            d = first_difference(a[k], b[k], f"{where}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if type(a) is not type(b) or a != b or (isinstance(a, float) and math.copysign(1, a) != math.copysign(1, b)):
        return f"{where}: {a!r} != {b!r}"
    return None


def main(names: list[str]) -> None:
    """Recompute the cases ``names`` (all when empty) and write them into :data:`PATH`."""
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; the cases are {list(CASES)}")
    stored = load() if PATH.exists() and names else {}
    for name in names or CASES:
        print(f"recording {name}", flush=True)
        stored[name] = compute(name)
    PATH.write_text(json.dumps({n: stored[n] for n in CASES if n in stored}, indent=1) + "\n")
    print(f"wrote {len(stored)} cases to {PATH}")


if __name__ == "__main__":
    main(sys.argv[1:])
