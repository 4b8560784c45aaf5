"""The course's scorecard: every claim of the FedDr+ paper that a chapter tests, in one table
(``docs/scorecard.md``), beside the paper's own number and, once they exist, the paper-scale runs.

The paper is *FedDr+: Stabilizing Dot-regression with Global Feature Distillation for Federated
Learning* (Kim et al., arXiv:2406.02355). Each results chapter (00 and 03-08) computes its claims table
from the CSVs in ``results/`` in its own cells. This script runs those cells up to the table, in a fresh
interpreter from ``notebooks/`` with the chapter's default parameters (nothing trains: the tables are
read from the CSVs, and the live slices come after them), keeps the rows whose source is the paper, and
writes one Markdown table. So the scorecard says what the chapters say, with their intervals, margins and
verdicts (``fk.stats.verdict``), and changes only when a chapter or its CSV does.

The paper's number beside each claim is the same difference read off the paper's tables, at the
paper's scale and in the setting nearest the chapter's (named in the cell); a claim the paper makes
from a figure, or in words, has none. The last column holds the paper-scale runs: rows of the CSVs
in ``results/paper_scale/`` (columns ``chapter``, ``claim``, ``setting``, ``value ± interval``,
``verdict``, as a chapter's claims table), matched to a claim by chapter, claim and setting; "not run"
until there is one.

    PYTHONPATH=. python results/scorecard.py            # rewrite docs/scorecard.md (a minute or two)
    PYTHONPATH=. python results/scorecard.py --check    # exit 1 when docs/scorecard.md is not what it would write
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
OUT = REPO / "docs" / "scorecard.md"
PAPER_SCALE = REPO / "results" / "paper_scale"

# chapter -> (a line that starts the cell holding its claims, the expression giving the claims table); a tuple
# of lines instead names the only cells to run (chapter 00 trains live before its table, which needs none of it)
CHAPTERS = {
    "00_quickstart": (("# Parameters", "import feddr_kit as fk", "data = fk.data.load(", "RESULTS = fk.repo.results()",
                       "claims_table = "), "claims_table"),
    "03_dr_forgets_unseen": ("claims = ", "claims"),
    "04_feature_distillation": ("claims = ", "claims"),
    "05_nine_algorithms": ("claims_table = ", "claims_table"),
    "06_regularizer_synergy": ("claims_table = ", "claims_table"),
    "07_sensitivity": ("claims_table = ", "claims_table"),
    "08_personalization": ("verdicts = ", "verdicts"),
}
COLUMNS = ["claim", "source", "setting", "seeds", "value ± interval", "margin", "verdict"]


def chapter_claims(chapter: str, marker: str | tuple[str, ...], expression: str) -> pd.DataFrame:
    """The claims table of ``notebooks/<chapter>.ipynb`` at its default parameters: its code cells up to
    the first one with a line starting with ``marker`` (or, for a tuple of markers, the first cell with each),
    run in a fresh interpreter from notebooks/."""
    cells = [c.source for c in nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4).cells if c.cell_type == "code"]

    def first(m: str) -> int:
        i = next((i for i, s in enumerate(cells) if any(line.startswith(m) for line in s.splitlines())), None)
        if i is None:
            raise SystemExit(f"{chapter}: no code cell has a line starting with {m!r}")
        return i

    chosen = [first(m) for m in marker] if isinstance(marker, tuple) else list(range(first(marker) + 1))
    script = ("import json\nns = {}\n"
              + "".join(f"exec(compile({cells[i]!r}, 'cell {i}', 'exec'), ns)\n" for i in chosen)
              + f"t = eval({expression!r}, ns)\nprint('\\nCLAIMS ' + t[{COLUMNS!r}].to_json(orient='records'))\n")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(REPO), "FEDDR_PROGRESS": "off"}
    out = subprocess.run([sys.executable, "-c", script], cwd=NOTEBOOKS, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{chapter}: its cells failed:\n{out.stderr[-3000:]}")
    line = next(ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("CLAIMS "))
    return pd.DataFrame(json.loads(line[len("CLAIMS "):]), columns=COLUMNS).assign(chapter=chapter)


# --------------------------------------------------------------------------- the paper's numbers
# tab:pfl_acc (MobileNet on CIFAR-100; the paper's PFL tables have no CIFAR-10 block): the mean over
# clients of one seed, in percent; apptab:pfl_acc adds the FedDr+ global model (its FedDr+ FT row is the
# same as tab:pfl_acc's).
PFL_COLUMNS = ("s=10", "s=20", "s=100", "α=0.05", "α=0.1", "α=0.3")
PFL = {
    "local-ce": (58.05, 42.45, 18.69, 55.39, 43.76, 27.75),
    "local-ce_etf": (58.01, 41.62, 18.92, 55.34, 43.37, 27.87),
    "local-dr": (60.68, 44.61, 20.98, 58.56, 46.72, 30.88),
    "fedper": (70.67, 57.27, 24.30, 62.67, 53.43, 35.68),
    "perfedavg": (32.13, 36.66, 41.27, 28.81, 35.56, 42.80),
    "fedrep": (63.14, 51.69, 26.31, 57.53, 49.60, 37.00),
    "ditto": (39.26, 38.18, 44.53, 35.81, 37.81, 43.72),
    "fedavg-FT": (69.81, 56.13, 47.66, 63.37, 56.79, 50.12),
    "fedbabu-FT": (80.14, 70.89, 52.14, 75.50, 70.83, 56.91),
    "spherefed-FT": (81.90, 71.56, 55.83, 73.21, 70.00, 60.03),
    "fedetf-FT": (53.75, 52.94, 51.69, 52.96, 53.97, 51.67),
    "feddr+-FT": (84.10, 75.42, 56.76, 78.55, 74.75, 62.16),
    "feddr+ global": (48.69, 51.00, 53.23, 39.63, 45.83, 48.04),  # apptab:pfl_acc
}
NAMES = {"fedavg": "FedAvg", "scaffold": "SCAFFOLD", "fedntd": "FedNTD", "fedexp": "FedExP", "fedbabu": "FedBABU",
         "spherefed": "SphereFed", "fedetf": "FedETF", "feddr+": "FedDr+", "dr": "DR", "none": "no regularizer",
         "prox": "Prox", "kd": "KD", "ntd": "NTD", "ld": "LD", "fd": "FD", "local-ce": "local-only CE",
         "local-dr": "local-only DR", "fedper": "FedPer", "perfedavg": "Per-FedAvg", "fedrep": "FedRep", "ditto": "Ditto"}
FIGURE = "none: a figure (`{}`)"


def _pp(x: float) -> str:
    return f"{x:+.2f} pp"


def gfl(a: str, b: str, column: str) -> str:
    """``a`` − ``b`` in the paper's GFL table (VGG-11 on CIFAR-10, mean of three seeds)."""
    import feddr_kit as fk

    t = fk.paper.table3([column])
    x, y = t.loc[(a, "mean"), column], t.loc[(b, "mean"), column]
    if y != y:  # NaN: the paper marks the run failed
        return f"none: {NAMES[b]}'s run failed in the paper (VGG-11, CIFAR-10 {column}, `tab:gfl_acc_all`)"
    return f"{_pp(x - y)} ({NAMES[a]} {x:.2f} vs {NAMES[b]} {y:.2f}; VGG-11, CIFAR-10 {column}, `tab:gfl_acc_all`)"


def synergy(cells: list[tuple[str, str, int]]) -> str:
    """A signed sum of cells of the paper's synergy table (MobileNet, CIFAR-100), in both of its settings:
    ``cells`` = [(method, regularizer, ±1), ...]."""
    import feddr_kit as fk

    parts = []
    for setting in ("s=10", "α=0.1"):
        t = fk.paper.table1(setting)
        parts.append(f"{_pp(sum(sign * t.loc[m, r] for m, r, sign in cells))} at {setting}")
    return f"{', '.join(parts)} (MobileNet, CIFAR-100, `tab:synergy_effect`)"


def pfl(a: str, b: str, column: str) -> str:
    """``a`` − ``b`` in the paper's PFL tables (MobileNet, CIFAR-100, one seed)."""
    i = PFL_COLUMNS.index(column)
    x, y = PFL[a][i], PFL[b][i]
    label = "`apptab:pfl_acc`" if "global" in (a + b) else "`tab:pfl_acc`"
    return f"{_pp(x - y)} ({x:.2f} vs {y:.2f}; MobileNet, CIFAR-100 {column}, {label})"


def _setting(setting: str, gfl_columns=("s=2", "s=5", "s=10", "α=0.1", "α=0.2", "α=0.3")) -> str | None:
    """The paper's column for a chapter's setting text ("s=2, 120 rounds …" -> "s=2")."""
    m = re.search(r"\b(s=\d+|α=[\d.]+)", setting)
    return m[1] if m and m[1] in gfl_columns else None


def paper_number(chapter: str, claim: str, setting: str) -> str:
    """The paper's own value of the difference a claim tests, with where it comes from."""
    col = _setting(setting)
    by_name = {v.lower(): k for k, v in NAMES.items()}
    if chapter == "00_quickstart":
        return gfl("feddr+", "fedavg", col)
    if chapter == "03_dr_forgets_unseen":
        if "global model" in claim:
            return ("+3.86 pp (CE 46.38 vs DR 42.52; MobileNet, CIFAR-100 s=10, the text of section *Impact of "
                    "Dot-Regression Loss on Local and Global Models*; its tables give FedAvg 36.63 and 37.22 there)")
        return FIGURE.format("fig:gain_align_acc" if "local − global" in claim else "fig:local_align_acc")
    if chapter == "04_feature_distillation":
        if "global model" in claim:
            return synergy([("dr", "fd", 1), ("dr", "none", -1)]) + "; `tab:gfl_acc_all` gives FedDr+ 48.21 at s=10"
        if "local − global" in claim:
            return "none: stated in words (section *Effect of Feature Distillation*)"
        if "alignment" in claim or "accuracy" in claim:
            return FIGURE.format("fig:comparison")
        return FIGURE.format("fig:feature_dynamic_change")
    if chapter == "05_nine_algorithms":
        m = re.match(r"FedDr\+ beats (\w+)", claim)
        other = by_name.get(m[1].lower()) if m else None
        if other == "dr":
            return synergy([("dr", "fd", 1), ("dr", "none", -1)]) + "; DR is not in `tab:gfl_acc_all`"
        return gfl("feddr+", other, col) if other else "none"
    if chapter == "06_regularizer_synergy":
        m = re.match(r"with dr, FD beats (\w+)", claim)
        if m:
            return synergy([("dr", "fd", 1), ("dr", m[1], -1)])
        if claim.startswith("FD helps dr more than it helps fedavg"):
            return synergy([("dr", "fd", 1), ("dr", "none", -1), ("fedavg", "fd", -1), ("fedavg", "none", 1)])
        if claim.startswith("FD helps dr"):
            return synergy([("dr", "fd", 1), ("dr", "none", -1)])
        return "none"
    if chapter == "07_sensitivity":
        if re.match(r"fed\w+: 10 local epochs beat", claim):
            return "none: stated in words (CIFAR-10 grid search, appendix `appsubsec:grid_search`: 10 epochs best for every algorithm)"
        return FIGURE.format("fig:sensitivity")
    if chapter == "08_personalization":
        # chapter 08 sets s=2 beside the paper's s=20 (a fifth of the classes per client either way)
        pcol = {"s=2": "s=20", "α=0.1": "α=0.1"}.get(col)
        if pcol is None:
            return "none"
        if "global FedDr+ model" in claim or claim.startswith("… the same"):
            return pfl("feddr+-FT", "feddr+ global", pcol)
        m = re.match(r"FedDr\+ FT beats (\S+)-FT$", claim)
        if m:
            return pfl("feddr+-FT", f"{by_name[m[1].lower()]}-FT", pcol)
        m = re.search(r"1-step PFL method here \((\w+)\)|^FedDr\+ FT beats (FedPer|FedRep|Ditto|Per-FedAvg)$", claim)
        if m:
            return pfl("feddr+-FT", (m[1] or by_name[m[2].lower()]), pcol)
        if claim.startswith("FedDr+ FT beats local-only DR"):
            return pfl("feddr+-FT", "local-dr", pcol)
        if claim.startswith("local-only DR beats local-only CE"):
            return pfl("local-dr", "local-ce", pcol)
        return "none"
    return "none"


# --------------------------------------------------------------------------- paper scale
def paper_scale_rows(folder: Path = PAPER_SCALE) -> pd.DataFrame:
    """The finished paper-scale runs: ``folder``'s ``paper_scale.csv`` (written by results/paper_scale.py, one
    row per run: setting, cell, seed, algorithm, final_acc, ...), without the β-scaled control runs (they are
    DR runs under another name); an empty frame when there is none."""
    path = folder / "paper_scale.csv"
    runs = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["setting", "cell", "seed", "algorithm", "final_acc"])
    return runs[~runs["cell"].astype(str).str.contains("control")].reset_index(drop=True)


def paper_scale_result(chapter: str, claim: str, setting: str, runs: pd.DataFrame, margin: float = 0.005) -> str:
    """A claim "FedDr+ beats X" (chapters 00 and 05: final accuracy, paired by seed) at the paper's scale:
    "+1.2 ± 0.4 pp, held (n=3)" from the runs of its setting, or "not run" while a side has no run."""
    import feddr_kit as fk

    m = re.match(r"FedDr\+ beats (\w+)", claim)
    col = _setting(setting)
    if chapter not in ("00_quickstart", "05_nine_algorithms") or not m or col is None or runs.empty:
        return "not run"
    other = {v.lower(): k for k, v in NAMES.items()}.get(m[1].lower())
    side = lambda a: runs[(runs["setting"] == col) & (runs["algorithm"] == a)].set_index("seed")["final_acc"]
    a, b = side("feddr+"), side(other)
    seeds = sorted(set(a.index) & set(b.index))
    if not seeds:
        return "not run"
    d = fk.stats.difference(a[seeds].to_numpy(float), b[seeds].to_numpy(float), paired=True)
    return f"{d.format('.1f', 100, ' pp', sign=True)}, {fk.stats.verdict(d, 'greater', margin)} (n={d.n})"


# --------------------------------------------------------------------------- the page
def scorecard(tables: dict[str, pd.DataFrame], scale: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per claim of the paper (source "paper", testable) over every chapter's claims table."""
    import feddr_kit as fk

    rows = pd.concat(list(tables.values()), ignore_index=True) if tables else pd.DataFrame(columns=COLUMNS + ["chapter"])
    rows = rows[(rows["source"] == "paper") & (rows["verdict"] != fk.stats.UNTESTABLE)].reset_index(drop=True)
    rows["paper"] = [paper_number(r.chapter, r.claim, r.setting) for r in rows.itertuples()]
    runs = scale if scale is not None else paper_scale_rows()
    rows["paper scale"] = [paper_scale_result(r.chapter, r.claim, r.setting, runs) for r in rows.itertuples()]
    return rows


def markdown(rows: pd.DataFrame) -> str:
    """The scorecard page: a count of the verdicts, then the table."""
    import feddr_kit as fk

    ORDER = [fk.stats.HELD, fk.stats.NOT_HELD, fk.stats.TIE_AGAINST, fk.stats.TIE_TOWARD, fk.stats.TIE, fk.stats.UNTESTABLE]

    counts = rows["verdict"].value_counts()
    lines = [
        "# Scorecard: the paper's claims at the teaching scale",
        "",
        "<!-- written by results/scorecard.py from the chapters' claims tables: do not edit by hand -->",
        "",
        "Every claim of the FedDr+ paper (*FedDr+: Stabilizing Dot-regression with Global Feature Distillation "
        "for Federated Learning*, Kim et al., arXiv:2406.02355) that a chapter tests, with the chapter's own "
        "interval, margin and verdict, over three seeds (or, where the column says so, a seed's 100 clients). "
        "The runs are at the teaching scale (`docs/teaching_scale.md`: a small BatchNorm CNN on CIFAR-10, 120 "
        "rounds of 10 of 100 clients, one local epoch, on a CPU; chapter 07 cuts the rounds to 40); the paper's "
        "number beside each is at its own scale, in the setting named there. A verdict is about the teaching "
        "scale only: it says whether the claim's effect shows here, not whether the paper is right at its scale, "
        "which is what the last column is for.",
        "",
        "How to read a verdict (`fk.stats.verdict`): **held** and **did not hold** mean the whole 95 % interval "
        "lies beyond the margin, on the claim's side or on the other; a **tie, below the margin, against "
        "the claim** means the difference goes the other way (the interval excludes zero) without being shown "
        "as large as the margin, and its mirror, **in the claim's direction**, the claimed way; a plain "
        "**tie (within the interval)** means not even the sign is known.",
        "",
        f"In all, {len(rows)} claims: " + ", ".join(f"{counts[v]} {v}" for v in ORDER if v in counts) + ".",
        "",
        "| chapter | claim | setting | n | effect ± 95 % interval | margin | verdict | the paper's number | paper scale |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = ["claim", "setting", "seeds", "value ± interval", "margin", "verdict", "paper", "paper scale"]
    for r in rows.to_dict("records"):
        cells = [r["chapter"][:2]] + [str(r[c]).replace("|", "\\|") for c in order]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with docs/scorecard.md instead of writing it")
    args = parser.parse_args()
    rows = scorecard({ch: chapter_claims(ch, *how) for ch, how in CHAPTERS.items()})
    page = markdown(rows)
    if args.check:
        same = OUT.is_file() and OUT.read_text() == page
        print("docs/scorecard.md is up to date" if same else "docs/scorecard.md differs from what the chapters give: "
              "run PYTHONPATH=. python results/scorecard.py")
        return 0 if same else 1
    OUT.write_text(page)
    print(f"wrote {OUT.relative_to(REPO)}: {len(rows)} claims")
    return 0


if __name__ == "__main__":
    sys.exit(main())
