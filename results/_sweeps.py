"""What the results scripts share: their command line, a run of one sweep per setting, and the CSVs.

Each ``results/<chapter>.py`` declares its settings (named partial configs) and its grid, then calls
:func:`main`. Runs go to ``results/runs/<chapter>/<setting>/<run>/`` (resumable: kill and start again;
two processes on one chapter share the work through the runs' locks), and once every planned run has
finished, the collected rows to ``results/<chapter>.csv`` (one row per run) and
``results/<chapter>_history.csv`` (one row per run and evaluated round).

The run folders are in git without their checkpoints (``.gitignore``), so a sweep spread over several
machines or sessions goes on where it stopped: commit the finished runs with

    git add $(find results/runs -name summary.json -printf '%h\n')

``results/runs/<chapter>/plan.json`` lists every run the chapter's sweep will hold, so a chapter can
say how far its sweep is (:func:`progress`) before the CSVs exist.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

import feddr_kit as fk

RESULTS = Path(__file__).resolve().parent
RUNS = RESULTS / "runs"
# The chapters' committed runs were trained contiguous (NCHW), the kit's layout by default when they ran. Pinned,
# so that a rerun reproduces them bit for bit and continues their roots: the default now lays out channels-last
# on the CPU, the same arithmetic with other float rounding.
LAYOUT = {"channels_last": False}
BASE = {**fk.sweep.TEACHING_SCALE, **LAYOUT}
SUMMARY_COLUMNS = ["final_acc", "best_acc", "last5_acc", "final_local_acc", "sec_per_round", "total_seconds"]


def slug(setting: str) -> str:
    """A folder name for a setting label such as ``"α=0.1"`` (``"alpha=0.1"``)."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", setting.replace("α", "alpha").replace("β", "beta"))


def plan(settings: Mapping[str, Mapping[str, Any]], grid: Mapping[str, Sequence], seeds: Sequence[int],
         base: Mapping[str, Any]) -> list[str]:
    """Every run folder of the sweep, ``<setting>/<run>`` relative to the chapter's root, seed-major."""
    out = []
    for seed in seeds:
        for name in settings:
            g = grid[name] if set(grid) == set(settings) else grid
            b = {**base, **settings[name]}
            out += [f"{slug(name)}/{fk.sweep.run_dir_name(c, b, g)}" for c in fk.sweep.expand(b, g, [seed])]
    return out


def progress(chapter: str, root: Path | None = None) -> tuple[int, int]:
    """``(finished, planned)`` runs of a chapter's sweep, from its ``plan.json`` (``runs``: folders, done when
    they hold ``summary.json``; ``files``: items done when the file exists); ``(0, 0)`` before it started."""
    root = Path(root) if root is not None else RUNS / chapter
    if not (root / "plan.json").exists():
        return 0, 0
    plan_ = json.loads((root / "plan.json").read_text())
    runs, files = plan_.get("runs", []), plan_.get("files", [])  # files: items that leave one file, not a run
    done = sum((root / n / "summary.json").exists() for n in runs) + sum((root / f).exists() for f in files)
    return done, len(runs) + len(files)


def main(chapter: str, settings: Mapping[str, Mapping[str, Any]], grid: Mapping[str, Sequence],
         seeds: Sequence[int], base: Mapping[str, Any] = BASE, doc: str = "") -> pd.DataFrame | None:
    """Parse ``--seeds/--settings/--root/--threads``, run ``grid`` × seeds in every chosen setting
    (seed-major, so a partial sweep already covers every cell once), then, once every planned run has
    finished (or with ``--collect-only``), write the chapter's CSVs from every finished run under the
    root. ``grid`` is one grid for all settings, or a grid per setting (keyed by the settings' names).
    Returns the collected frame, or None while the sweep is incomplete."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else chapter)
    p.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    p.add_argument("--settings", nargs="+", default=list(settings), choices=list(settings))
    p.add_argument("--root", default=str(RUNS / chapter))
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: run one script per core)")
    p.add_argument("--collect-only", action="store_true", help="only rewrite the CSVs from the runs on disk, "
                   "even when the sweep is incomplete")
    p.add_argument("--status", action="store_true", help="print how many planned runs have finished, and stop")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "plan.json").write_text(json.dumps({"base": dict(base), "seeds": list(seeds),
                                                "runs": plan(settings, grid, seeds, base)}, indent=1) + "\n")
    if not (args.collect_only or args.status):
        data = fk.data.load(base.get("dataset", "cifar10"))
        for seed in args.seeds:
            for name in args.settings:
                g = grid[name] if set(grid) == set(settings) else grid
                fk.sweep.run({**base, **settings[name]}, g, [seed], root / slug(name), data=data)
    done, planned = progress(chapter, root)
    print(f"{chapter}: {done} of {planned} planned runs finished")
    if args.status or (done < planned and not args.collect_only):
        return None
    return write_csvs(chapter, root, settings, threads=args.threads)


def write_csvs(chapter: str, root: Path, settings: Mapping[str, Mapping[str, Any]], threads: int = 1) -> pd.DataFrame:
    """Collect every finished run under ``root/<setting>/`` into ``results/<chapter>.csv`` (a
    ``setting`` column, the config fields that vary, the summary) and its histories into
    ``results/<chapter>_history.csv``. ``threads``: the torch threads the runs used, for the
    ``machine`` column. Returns the summary frame."""
    frames, hists = [], []
    for name in settings:
        folder = root / slug(name)
        if not folder.is_dir():
            continue
        df = fk.sweep.collect(folder)
        df = df[df["status"] == "done"] if not df.empty else df
        if df.empty:  # nothing finished yet in this setting (its first runs may be under way)
            continue
        frames.append(df.assign(setting=name))
        h = fk.sweep.histories(folder)
        if not h.empty:
            hists.append(h.assign(setting=name))
    if not frames:
        raise SystemExit(f"no finished runs under {root}")
    df = pd.concat(frames, ignore_index=True)
    varying = [c for c in df.columns if c not in SUMMARY_COLUMNS + ["name", "status", "setting", "seed", "out_dir"]
               and c in fk.Config.__dataclass_fields__ and df[c].astype(str).nunique() > 1]
    lr = ["summary_lr0"] if "summary_lr0" in df else ["lr0"] if "lr0" in df else []
    out = df[["setting", *varying, "seed", *lr, *SUMMARY_COLUMNS, "name"]].rename(columns={"summary_lr0": "lr0"})
    out = out.assign(machine=f"{platform.machine()} {os.cpu_count()} cores, {threads} torch thread(s) per run")
    out.to_csv(RESULTS / f"{chapter}.csv", index=False)
    if hists:
        h = pd.concat(hists, ignore_index=True)
        keep = ["setting", "name", "round", "test_acc", "local_test_acc", "lr", "train_loss"]
        h[[c for c in keep if c in h.columns]].to_csv(RESULTS / f"{chapter}_history.csv", index=False)
    print(f"{len(out)} runs -> {RESULTS / (chapter + '.csv')}")
    return out
