"""Chapter 08's sweep: personalization (the paper's table of personalized-FL accuracy, ``tab:pfl_acc``)
at the teaching scale (``fk.sweep.TEACHING_SCALE``: ``cnn_bn``, 120 rounds of 10 of 100 clients, 1 local
epoch) on shard s=2 and Dirichlet α=0.1, chapter 05's two settings, three seeds.

Three families, each scored by the mean over the 100 clients of the accuracy of the client's
personalized model on its own test set (the partition's local test set):

* "-FT" (two-step): the GFL runs of chapter 05 (the SAME configs and root, run by ``fk.sweep.run``
  with chapter 05's base and grid, so finished runs are reused), each fine-tuned on every client by
  ``fk.personalize.finetune`` with the protocol's 5 epochs at the run's last-round lr.
* 1-step PFL: fedper, fedrep, perfedavg, ditto on the round loop (``fk.sweep.run`` into
  ``results/runs/ch08_personalization/<setting>/pfl``); FedRep takes 1 head epoch per visit (its
  code: 10). Each finished PFL run's per-client accuracies are kept in its folder's ``clients.csv``.
* local-only: CE and DR, each client alone for the local steps it takes in expectation in the
  federated run (``fk.personalize.local_only``).

Budget cut, decided before any run (3 hours of 2 CPU cores, about 55 default-run equivalents; the
GFL runs are chapter 05's): local-only with the ETF-initialized CE head is cut (the paper finds it
equal to plain CE on CIFAR-10: 2 × 3 equivalents saved); FedRep's head epochs 1 instead of 10.

Work is done in priority tiers (FedDr+-FT, FedAvg-FT and PFL first), each item saved as it
finishes, so the script can be killed and started again, and it stops starting new items once its
CPU time passes ``--budget-min``. While chapter 05's sweep is still filling the GFL root, pass
``--gfl-wait`` to wait for its runs instead of running them here. A fine-tuning needs its GFL run's
checkpoint, which git does not keep: on a fresh clone the run is trained again (same folder, same
numbers). The CSVs are written once every item has finished::

    nohup python results/ch08_personalization.py --gfl-wait &     # CIFAR-10 where the README's Data section says
    python results/ch08_personalization.py --collect-only     # rewrite the CSVs from results/runs/
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import feddr_kit as fk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sweeps import BASE, RESULTS, RUNS, slug  # noqa: E402
from ch05_algorithms import GRID as GFL_GRID  # noqa: E402
from ch05_algorithms import SETTINGS as CH05_SETTINGS  # noqa: E402

CHAPTER = "ch08_personalization"
SETTINGS = {name: CH05_SETTINGS[name] for name in ("s=2", "α=0.1")}
SEEDS = [0, 1, 2]
FT_ALGORITHMS = ["feddr+", "fedavg", "fedbabu", "spherefed", "fedetf"]
PFL_ALGORITHMS = fk.algorithms.algorithm_names(personalized=True)
LOCAL_LOSSES = ["ce", "dr"]
FT_EPOCHS = 5           # the protocol's, at the run's last-round lr
PFL_BASE = {"fedrep_head_epochs": 1}  # FedRep's CIFAR-10 code: 10 (budget)


def gfl_folder(gfl_root: Path, setting: str, algorithm: str, seed: int) -> Path:
    return gfl_root / slug(setting) / f"algorithm={algorithm}__seed={seed}"


def items(seeds: list[int], settings: list[str]) -> list[tuple]:
    """The work in priority order, (kind, setting, seed, what): the first seed's whole table in the first
    setting; FedDr+-FT and FedAvg-FT (the chapter's main comparison) on every seed there; the first
    seed in the other settings; then everything else. A cut budget loses the tail, never the main claim."""
    every = lambda s, seed: [("ft", s, seed, "feddr+"), ("ft", s, seed, "fedavg"), ("pfl", s, seed, None),
                             *(("local", s, seed, loss) for loss in LOCAL_LOSSES),
                             *(("ft", s, seed, a) for a in FT_ALGORITHMS[2:])]
    first, rest = settings[0], settings[1:]
    order = every(first, seeds[0])
    order += [("ft", first, seed, a) for a in ("feddr+", "fedavg") for seed in reversed(seeds[1:])]  # chapter 05 reaches seed 2 last
    order += [i for s in rest for i in every(s, seeds[0])]
    order += [i for seed in seeds[1:] for s in settings for i in every(s, seed)]
    return list(dict.fromkeys(order))


def item_file(root: Path, kind: str, setting: str, seed: int, what: str) -> Path:
    return root / slug(setting) / kind / f"{what}__seed={seed}.csv"


def run_item(item, root: Path, gfl_root: Path, data, wait: bool, gfl_run: list[str]) -> bool:
    """Run one item unless done; False when it has to wait for chapter 05's run (``wait`` and the
    algorithm not in ``gfl_run``, the ones this script may run into chapter 05's root itself)."""
    kind, setting, seed, what = item
    base = {**BASE, **SETTINGS[setting]}  # chapter 05's base (its layout pinned), so its runs are reused
    if kind == "pfl":
        for run in (root / slug(setting) / "pfl").glob(f"algorithm=*__seed={seed}"):
            if (run / "summary.json").exists() and not (run / "clients.csv").exists() and not (run / "checkpoint.pt").exists():
                # finished elsewhere without its per-client table, and git keeps no model: train it again
                (run / "summary.json").unlink()
        fk.sweep.run({**base, **PFL_BASE}, {"algorithm": PFL_ALGORITHMS}, [seed], root / slug(setting) / "pfl",
                     data=data, progress=False)
        for run in (root / slug(setting) / "pfl").glob(f"algorithm=*__seed={seed}"):
            pfl_clients(run)
        return True
    out = item_file(root, kind, setting, seed, what)
    if out.exists():
        return True
    if kind == "local":
        res = fk.personalize.local_only(fk.Config(**base, seed=seed, progress=False), what, data=data)
    else:
        folder = gfl_folder(gfl_root, setting, what, seed)
        # not run yet, still running (its checkpoint is a round's, not the end's), or a fresh clone (no checkpoints)
        if not ((folder / "summary.json").exists() and (folder / "checkpoint.pt").exists()):
            if what in gfl_run:  # chapter 05's run of this point (the same folder name as its whole grid gives)
                fk.sweep.run(base, {"algorithm": [what]}, [seed], gfl_root / slug(setting), data=data, progress=False)
            elif wait:
                return False
            else:
                fk.sweep.run(base, GFL_GRID, [seed], gfl_root / slug(setting), data=data)  # chapter 05's own sweep
            if not (folder / "checkpoint.pt").exists() and (folder / "summary.json").exists():
                # finished in another session: git kept its results, not its model; train it again
                (folder / "summary.json").unlink()
                fk.sweep.run(base, {"algorithm": [what]}, [seed], gfl_root / slug(setting), data=data, progress=False)
        res = fk.personalize.finetune(folder, epochs=FT_EPOCHS, data=data)
    out.parent.mkdir(parents=True, exist_ok=True)
    res.per_client.assign(method=res.method, **{k: v for k, v in res.info.items() if k != "seed"}).to_csv(out, index=False)
    return True


def pfl_clients(run: Path) -> None:
    """Write a finished PFL run's per-client accuracies to ``run/clients.csv`` (from its checkpoint,
    which git does not keep), once."""
    if (run / "clients.csv").exists() or not (run / "summary.json").exists():
        return
    ckpt = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    st, cfg = ckpt["algorithm_state"], ckpt["config"]
    visited = set(st["visited"])
    pd.DataFrame([{"client": k, "after": a, "visited": k in visited, "seed": cfg["seed"], "method": cfg["algorithm"]}
                  for k, a in enumerate(st["client_acc"])]).to_csv(run / "clients.csv", index=False)


def collect(root: Path, gfl_root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (setting, method, seed) and one per client: from the item CSVs and the PFL runs."""
    clients = []
    for setting in SETTINGS:
        for kind, family in (("ft", "FT"), ("local", "local-only")):
            for f in sorted((root / slug(setting) / kind).glob("*.csv")):
                df = pd.read_csv(f)
                seed = int(f.stem.split("__seed=")[1])
                clients.append(df.assign(setting=setting, family=family, seed=seed))
        for run in sorted((root / slug(setting) / "pfl").glob("algorithm=*__seed=*")):
            if (run / "clients.csv").exists():
                clients.append(pd.read_csv(run / "clients.csv").assign(setting=setting, family="PFL", before=float("nan")))
    if not clients:
        raise SystemExit(f"nothing finished under {root}")
    per_client = pd.concat(clients, ignore_index=True)
    keep = ["setting", "family", "method", "seed", "client", "n_train", "n_test", "before", "after", "visited"]
    per_client = per_client[[c for c in keep if c in per_client]]
    g = per_client.groupby(["setting", "family", "method", "seed"], sort=False)
    summary = g.agg(acc=("after", "mean"), acc_std_clients=("after", lambda a: a.std(ddof=0)),
                    before=("before", "mean"), clients=("after", "size")).reset_index()
    summary["gain"] = summary["acc"] - summary["before"]
    summary["ft_epochs"] = summary["family"].map({"FT": FT_EPOCHS})
    return summary, per_client


def planned(seeds: list[int], settings: list[str]) -> int:
    """How many (setting, family, method, seed) rows the complete sweep holds."""
    return len(seeds) * len(settings) * (len(FT_ALGORITHMS) + len(PFL_ALGORITHMS) + len(LOCAL_LOSSES))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--root", default=str(RUNS / CHAPTER))
    p.add_argument("--gfl-root", default=str(RUNS / "ch05_algorithms"),
                   help="chapter 05's sweep root, whose GFL runs are fine-tuned (and run there when missing)")
    p.add_argument("--gfl-wait", action="store_true", help="wait for chapter 05's runs instead of running them")
    p.add_argument("--gfl-run", nargs="*", default=[], help="with --gfl-wait: algorithms whose missing GFL runs "
                   "this script runs itself (only those points, into the same folders chapter 05 would use)")
    p.add_argument("--budget-min", type=float, default=180.0, help="start no new item after this much CPU time")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--collect-only", action="store_true", help="write the CSVs from what finished, even if incomplete")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root, gfl_root = Path(args.root), Path(args.gfl_root)
    write_plan(root)  # always the whole sweep, whatever this process runs
    if not args.collect_only:
        data = fk.data.load("cifar10")
        pending = items(args.seeds, args.settings)
        while pending:
            if time.process_time() > 60 * args.budget_min:
                print(f"CPU budget of {args.budget_min} min reached; {len(pending)} items not run: {pending}", flush=True)
                break
            for item in pending:
                t0 = time.process_time()
                if run_item(item, root, gfl_root, data, args.gfl_wait, args.gfl_run):
                    pending.remove(item)
                    print(f"{time.strftime('%H:%M:%S')} done {item} in {time.process_time() - t0:.0f} s CPU "
                          f"(total {time.process_time() / 60:.1f} min)", flush=True)
                    break
            else:
                time.sleep(30)  # every remaining item waits for chapter 05
    summary = collect(root, gfl_root)[0] if any(root.glob("*/*/*")) else pd.DataFrame()
    total = planned(SEEDS, list(SETTINGS))
    print(f"{CHAPTER}: {len(summary)} of {total} planned rows finished")
    if len(summary) == total or args.collect_only:
        write(root, gfl_root)


def write_plan(root: Path) -> None:
    """``root/plan.json`` in the shape ``_sweeps.progress`` reads: the PFL runs (done with their
    ``summary.json``) and the fine-tuning and local-only items (done with their CSV)."""
    import json

    root.mkdir(parents=True, exist_ok=True)
    every = items(SEEDS, list(SETTINGS))
    runs = [f"{slug(s)}/pfl/algorithm={a}__seed={seed}" for kind, s, seed, _ in every if kind == "pfl"
            for a in PFL_ALGORITHMS]
    files = [str(item_file(Path(), kind, s, seed, what)) for kind, s, seed, what in every if kind != "pfl"]
    (root / "plan.json").write_text(json.dumps({"runs": runs, "files": files}, indent=1) + "\n")


def write(root: Path, gfl_root: Path) -> None:
    summary, per_client = collect(root, gfl_root)
    summary.to_csv(RESULTS / f"{CHAPTER}.csv", index=False)
    per_client.to_csv(RESULTS / f"{CHAPTER}_clients.csv", index=False)


if __name__ == "__main__":
    main()
