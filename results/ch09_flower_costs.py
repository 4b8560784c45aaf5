"""The cost of running on Flower (chapter 09): one FedDr+ run three ways, timed, histories compared.

1. ``fk.run`` (one process, the kit's loop);
2. ``feddr_kit.flower.run_in_process``: the ClientApp and the strategy called in-process, every
   message built and read (no Ray, no SuperLink): the cost of the Message API itself;
3. ``python -m feddr_kit flower`` (``feddr_kit.flower.simulate``): a SuperLink, ``flwr run`` and the
   Ray simulation with one SuperNode per client: the cost of the framework as people use it.

Same config for all (synthetic data, 4 clients, all 4 sampled per round, the default model, CPU, serial engine),
run one after the other on the same machine. Writes ``results/ch09_flower_costs.json``: the machine's
load average at the start, per path the wall time and each round's seconds, the simulation's
start-up (launch -> first round) and SuperLink start-up, the model's size on the wire, and whether the
three histories are identical (all columns but seconds) and the final weights bit-for-bit equal.

The default three rounds measure the start-up well (it is paid once and is much larger than a round),
but not a per-round overhead: round 1 of the simulation also starts Ray's actors, which leaves two
rounds to compare, and on a shared machine single rounds vary by a good fraction of a second. Chapter
09 therefore reports the per-round overhead with its interval over the rounds; ``--rounds 10`` or more,
on an idle machine, narrows that interval.

    OMP_NUM_THREADS=1 python results/ch09_flower_costs.py            # about 3-6 minutes
    python results/ch09_flower_costs.py --rounds 4 --out runs/ch09   # other settings
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import feddr_kit as fk  # noqa: E402
from feddr_kit import flower  # noqa: E402

OUT = ROOT / "results" / "ch09_flower_costs.json"


def config(rounds: int, out_dir: str | None = None) -> fk.Config:
    """The measured run: FedDr+, synthetic data, 4 clients, all sampled, 1 local epoch, constant lr."""
    return fk.Config(algorithm="feddr+", dataset="synthetic", num_clients=4, clients_per_round=4, shards_per_client=5,
                     rounds=rounds, local_epochs=1, eval_every=1, lr_gamma=1.0, progress=False, engine="serial",
                     device="cpu", out_dir=out_dir)


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal histories but for wall-clock seconds (values compared through CSV text, as saved)."""
    text = [h.drop(columns="seconds").to_csv(index=False) for h in (a, b)]
    return text[0] == text[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "runs" / "ch09_flower"), help="folder of the simulation's run")
    parser.add_argument("--json", default=str(OUT))
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    data = fk.data.load("synthetic")

    t = time.time()
    kit = fk.run(config(args.rounds), data=data)
    kit_wall = time.time() - t
    t = time.time()
    inproc = flower.run_in_process(config(args.rounds), data=data)
    inproc_wall = time.time() - t

    for attempt in range(4):  # Ray's start-up has a fixed 30 s limit that a loaded machine can miss
        shutil.rmtree(args.out, ignore_errors=True)
        try:
            sim = flower.simulate(config(args.rounds, args.out))
            break
        except fk.FeddrKitError as err:
            print(f"attempt {attempt + 1}: {err}", file=sys.stderr)
    else:
        raise SystemExit("the flwr run simulation failed four times")
    sim_history = pd.read_csv(Path(args.out) / "history.csv")
    sim_state = torch.load(Path(args.out) / "checkpoint.pt", weights_only=False)["global_state"]
    kit_history = pd.read_csv(pd.io.common.StringIO(kit.history.to_csv(index=False)))

    def weights_equal(state: dict) -> bool:
        return all(torch.equal(state[n].cpu(), v.cpu()) for n, v in kit.model.state_dict().items())

    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared: load average {load[0]:.1f} at the start",
        "flwr": __import__("flwr").__version__, "torch": torch.__version__,
        "config": {k: v for k, v in config(args.rounds).to_dict().items()
                   if k in ("algorithm", "dataset", "num_clients", "clients_per_round", "rounds", "local_epochs", "model")},
        "model_bytes": sim["model_bytes"],
        "messages_per_round": 2 * config(args.rounds).clients_per_round,
        "fk_run": {"wall_s": kit_wall, "round_seconds": [float(s) for s in kit.history["seconds"]]},
        "in_process": {"wall_s": inproc_wall, "round_seconds": [float(s) for s in inproc.history["seconds"]]},
        "flwr_run_attempts": attempt + 1,
        "flwr_run": {"wall_s": sim["wall_s"], "superlink_start_s": sim["superlink_start_s"],
                     "first_round_start_s": sim["first_round_start_s"], "round_seconds": sim["round_seconds"]},
        "identical": {"in_process_history": same(kit.history, inproc.history),
                      "in_process_weights": weights_equal(inproc.model.state_dict()),
                      "flwr_run_history": same(kit_history, sim_history),
                      "flwr_run_weights": weights_equal(sim_state)},
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
