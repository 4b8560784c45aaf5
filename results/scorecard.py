"""The course's scorecard: every claim of the FedDr+ paper that a chapter tests, in one table
(``docs/scorecard.md``), beside the paper's own number and, once they exist, the paper-scale runs.

The paper is *FedDr+: Stabilizing Dot-regression with Global Feature Distillation for Federated
Learning* (Kim et al., arXiv:2406.02355). Each results chapter (00 and 03-08) computes its claims table
from the CSVs in ``results/`` in its own cells. This script runs those cells up to the table, in a fresh
interpreter from ``notebooks/`` with the chapter's default parameters (nothing trains: the tables are
read from the CSVs, and the live slices come after them), keeps the rows a chapter credits to the paper,
and writes one Markdown table. So the scorecard says what the chapters say, with their intervals, margins
and verdicts (``fk.stats.verdict``), and changes only when a chapter or its CSV does.

What the scorecard adds to the chapters' rows:

- a source checked against the paper's text: a row whose claim the paper does not make (the β-scaled
  control, one lr for both losses, participation for FedDr+ and FedAvg) is labelled the course's own
  test (``OWN_TESTS``), and its verdict is counted apart from the paper's claims;
- a count of distinct comparisons: a row that repeats another (identical by construction, the same runs
  counted twice, or a per-seed client bootstrap restating the claim above it) keeps its line but takes
  the number of the row it repeats (:func:`fold`);
- each comparison's baseline check, where the chapter has one (a win over a model at chance shows only
  that the other side learns);
- the smallest effect each row could have detected: its interval's half-width, set beside the paper's
  effect, so that a tie that could not have come out otherwise shows.

The paper's number beside each claim is the same difference read off the paper's tables, at the
paper's scale and in the setting nearest the chapter's (named in the cell); a claim the paper makes
from a figure, or in words, has none, and neither has a row that measures something else. The last
column holds the paper-scale runs: rows of the CSVs in ``results/paper_scale/``, matched to a claim by
chapter, claim and setting; "not run" until there is one.

Chapters 04 (section 6) and 05 (section 7) also show the drift probe's comparisons, after their claims
tables: ``results/drift_probe.py`` (pre-registered in its docstring; report ``docs/drift.md``) at shard
s = 2 for 80 rounds, ``cnn_bn`` and ``cnn_nobn`` each at one and five local epochs. The scorecard reads them
as those cells do, through ``results/drift_report.py`` from ``results/drift_probe.csv``, and keeps a
comparison only once every cell it reads has its verdict seeds in (:func:`probe_claims`), so no row carries
a verdict from a cell still running. Each row goes to the chapter that shows it (the chapter's
``CLAIMS_SHOWN`` line) and passes the same filter as the chapters' own rows: C1 (FedDr+ against FedAvg) is
the paper's claim, C2 and C3 (against the β-scaled control) the course's own tests, and C4 and C5, which
``drift_report`` labels chapter hypotheses, are left to ``docs/drift.md`` as every chapter's hypotheses are.

    PYTHONPATH=. python results/scorecard.py            # rewrite docs/scorecard.md (a minute or two)
    PYTHONPATH=. python results/scorecard.py --check    # exit 1 when docs/scorecard.md is not what it would write
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
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
DRIFT_REPORT = REPO / "results" / "drift_report.py"

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
# what fk.sweep.baseline_columns adds to a claims table (chapters 05-07): the baseline's accuracy, and whether it learned
BASELINE_TEXT, BASELINE_OK = "baseline final acc (95 % interval)", "baseline above chance?"


def chapter_claims(chapter: str, marker: str | tuple[str, ...], expression: str) -> pd.DataFrame:
    """The claims table of ``notebooks/<chapter>.ipynb`` at its default parameters: its code cells up to
    the first one with a line starting with ``marker`` (or, for a tuple of markers, the first cell with each),
    run in a fresh interpreter from notebooks/. Its baseline columns come along where the chapter has them."""
    cells = [c.source for c in nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4).cells if c.cell_type == "code"]

    def first(m: str) -> int:
        i = next((i for i, s in enumerate(cells) if any(line.startswith(m) for line in s.splitlines())), None)
        if i is None:
            raise SystemExit(f"{chapter}: no code cell has a line starting with {m!r}")
        return i

    chosen = [first(m) for m in marker] if isinstance(marker, tuple) else list(range(first(marker) + 1))
    wanted = COLUMNS + [BASELINE_TEXT, BASELINE_OK]
    script = ("import json\nns = {}\n"
              + "".join(f"exec(compile({cells[i]!r}, 'cell {i}', 'exec'), ns)\n" for i in chosen)
              + f"t = eval({expression!r}, ns)\nt = t[[c for c in {wanted!r} if c in t.columns]]\n"
              + "print('\\nCLAIMS ' + t.to_json(orient='records'))\n")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(REPO), "FEDDR_PROGRESS": "off"}
    out = subprocess.run([sys.executable, "-c", script], cwd=NOTEBOOKS, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{chapter}: its cells failed:\n{out.stderr[-3000:]}")
    line = next(ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("CLAIMS "))
    return pd.DataFrame(json.loads(line[len("CLAIMS "):])).reindex(columns=wanted).assign(chapter=chapter)


# --------------------------------------------------------------------------- the drift probe
PROBE_LABEL = "drift probe"  # how a probe row's setting starts


@functools.cache
def drift_report():
    """``results/drift_report.py`` as a module: the probe's claims, cells and CSV, as chapters 04 and 05 read
    them (it loads the probe's design from ``results/drift_probe.py``)."""
    spec = importlib.util.spec_from_file_location("drift_report", DRIFT_REPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe_shown(chapter: str) -> tuple[str, ...]:
    """The probe comparisons ``notebooks/<chapter>.ipynb`` shows, from its ``CLAIMS_SHOWN = ("C2", "C3")``
    line; () for a chapter without one."""
    for cell in nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4).cells:
        if cell.cell_type == "code":
            for line in cell.source.splitlines():
                if line.startswith("CLAIMS_SHOWN = "):
                    return tuple(ast.literal_eval(line.partition("=")[2].strip()))
    return ()


def probe_claims(table: pd.DataFrame) -> list:
    """The probe's comparisons (as ``fk.stats.Claim``) every cell of which has its verdict seeds in:
    ``drift_report.decided_claims``, the rows chapters 04 and 05 show, so no verdict rests on seeds that are
    not all in."""
    return drift_report().decided_claims(table)


def probe_tables(table: pd.DataFrame, chapters=tuple(CHAPTERS)) -> dict[str, pd.DataFrame]:
    """Per chapter that shows some of them, the claims table of the probe's comparisons it shows
    (:func:`probe_shown`) among those whose cells are in (:func:`probe_claims`), each setting written
    "drift probe, <cell> (CIFAR-10 s=2, 80 rounds × 10 clients)"; a chapter with no such row is left out."""
    import feddr_kit as fk

    base = drift_report().PROBE.BASE
    scale = f"CIFAR-10 s={base['shards_per_client']}, {base['rounds']} rounds × {base['clients_per_round']} clients"
    claims, out = probe_claims(table), {}
    for chapter in chapters:
        shown = probe_shown(chapter)
        rows = fk.stats.claims_table([c for c in claims if shown and c.claim.startswith(shown)])
        if len(rows):
            where = rows["setting"].str.split(":").str[0]
            rows["setting"] = [f"{PROBE_LABEL}, {w} ({scale}){full[len(w):]}" for w, full in zip(where, rows["setting"])]
            out[chapter] = rows.assign(chapter=chapter)
    return out


def probe_status(done: list[str]) -> str:
    """Which of the probe's cells have their verdict seeds in, as the page's sentence."""
    cells = [drift_report().cell_label(*cell) for cell in drift_report().PROBE.CELLS]
    if not done:
        return (f"None of the probe's {len(cells)} cells has all its verdict seeds in yet, so it has no row here; "
                "`docs/drift.md` shows how far each has come.")
    if len(done) == len(cells):
        return f"All {len(cells)} of the probe's cells have their verdict seeds in, and each has its rows."
    verb = "has all its" if len(done) == 1 else "have all their"
    return (f"{len(done)} of the probe's {len(cells)} cells {verb} verdict seeds in ({'; '.join(done)}); "
            "the others have no row.")


# --------------------------------------------------------------------------- sources
# The rows a chapter labels "course test" (``fk.stats.SOURCES``): a claim of the paper put to a comparison the
# paper does not make. Each says why here: (chapter, pattern searched in "claim | setting", the source column's
# text, the paper's-number cell). The paper tunes each algorithm's lr and has no β-scaled control; its
# sensitivity section says "FedBABU and SphereFed ... show performance improvements with increasing fraction
# ratios", of FedAvg only that FedDr+ outperforms it.
OWN_TESTS = [
    ("03_dr_forgets_unseen", r"\| .*shared lr", "course: one lr for both losses",
     "none: the course's own test (the paper tunes each algorithm's lr, `appsubsec:grid_search`)"),
    ("04_feature_distillation", r", vs control \|", "course: against the β-scaled control (DR at lr × β)",
     "none: the paper has no β-scaled control"),
    # the drift probe's C2 and C3, which chapter 04 shows: FedDr+ against the same control, cell by cell
    ("04_feature_distillation", r"^C[23]: .*\bcontrol\b.* \| drift probe, ",
     "course: against the β-scaled control (DR at lr × β)", "none: the paper has no β-scaled control"),
    ("07_sensitivity", r"^(feddr\+|fedavg): participation ", "course: the paper says it of FedBABU and SphereFed",
     "none: the paper's figure has FedBABU and SphereFed gaining with participation (*Sensitivity Analysis*), "
     "not FedDr+ or FedAvg"),
]
ON_THE_CARD = ("paper", "course test")  # the sources whose rows the page lists; chapter hypotheses stay in the chapters


def own_test(chapter: str, claim: str, setting: str) -> tuple[str, str] | None:
    """(source, paper's-number cell) for a row that is the course's own test rather than the paper's claim,
    else None."""
    text = f"{claim} | {setting}"
    return next(((src, number) for ch, pattern, src, number in OWN_TESTS if ch == chapter and re.search(pattern, text)), None)


def source(chapter: str, claim: str, setting: str, label: str) -> str:
    """The page's source for a row the chapter labels ``label``: "paper", or for a "course test" the
    "course: <why>" of ``OWN_TESTS``. The chapter's label and ``OWN_TESTS`` must agree, so a row is never shown
    as the paper's when the paper does not state it, nor as the course's without its reason: else one line
    (``SystemExit``) naming the row."""
    own = own_test(chapter, claim, setting)
    if label == "course test" and own is None:
        raise SystemExit(f"{chapter}: {claim!r} ({setting}) is a course test with no reason in OWN_TESTS; add one")
    if label == "paper" and own is not None:
        raise SystemExit(f"{chapter}: {claim!r} ({setting}) is labelled 'paper', but it is the course's own test "
                         f"({own[0]}); label it 'course test'")
    return own[0] if own else "paper"


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
# apptab:pfl_acc's global FedDr+ entries: "without standard deviations ... results on D_test" (the s columns,
# the global test set in mixed batches); the α columns carry a spread over clients, so they are per-client means
PER_CLIENT_GAIN_VS_TEST_ACC = ("none: this gain is over the global model scored on each client's own test batches; "
                               "the paper's global number at {} (`apptab:pfl_acc`) is its accuracy on the global test "
                               "set, which the mixed-batch row compares like for like")


# "FedDr+ beats X" (chapters 00 and 05); the drift probe's C1, which chapter 05 shows, is the same claim at s=2
BEATS = r"(?:C1: )?FedDr\+ beats (\w+)"


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


def _personalization_number(claim: str, col: str | None) -> str:
    """Chapter 08's paper number: the same difference in the paper's PFL tables (its s=20 beside the
    chapter's s=2: a fifth of the classes per client either way)."""
    pcol = {"s=2": "s=20", "α=0.1": "α=0.1"}.get(col)
    by_name = {v.lower(): k for k, v in NAMES.items()}
    if pcol is None:
        return "none"
    if "scored in mixed batches" in claim:
        return pfl("feddr+-FT", "feddr+ global", pcol)
    if "global FedDr+ model" in claim or claim.startswith("… the same"):
        if pcol.startswith("s="):
            return PER_CLIENT_GAIN_VS_TEST_ACC.format(pcol)
        return pfl("feddr+-FT", "feddr+ global", pcol) + ": its global entry here is a per-client mean, as this row's"
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


def paper_number(chapter: str, claim: str, setting: str) -> str:
    """The paper's own value of the difference a claim tests, with where it comes from; "none: why" where
    the paper has no number for that difference (a figure, words, or a comparison it does not make)."""
    own = own_test(chapter, claim, setting)
    if own:
        return own[1]
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
        m = re.match(BEATS, claim)
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
        if re.match(r"\S+: 10 local epochs beat", claim):
            return "none: stated in words (CIFAR-10 grid search, appendix `appsubsec:grid_search`: 10 epochs best for every algorithm)"
        return FIGURE.format("fig:sensitivity")
    if chapter == "08_personalization":
        return _personalization_number(claim, col)
    return "none"


# --------------------------------------------------------------------------- what each row could detect
def half_width(value: str) -> tuple[float, str, int] | None:
    """A chapter's "value ± interval" text as (half-width, unit, decimals): "-2.5 ± 3.0 pp" -> (3.0, " pp", 1),
    "+51.1 [48.3, 53.9] pp" -> (2.8, " pp", 1) from the printed ends; None for an untestable "0.1 (n=1)"."""
    num = r"[+-]?\d+(?:\.\d+)?"
    m = re.fullmatch(rf"{num} ± (\d+(?:\.(\d+))?)(.*)", value.strip())
    if m:
        return float(m[1]), m[3], len(m[2] or "")
    m = re.fullmatch(rf"{num} \[({num}), ({num})\](.*)", value.strip())
    if m:
        return (float(m[2]) - float(m[1])) / 2, m[3], len(m[1].partition(".")[2])
    return None


def paper_effects(paper: str) -> list[float]:
    """The sizes of the effects a paper cell quotes in pp ("+1.69 pp (FedDr+ 83.22 vs …)" -> [1.69]); none for
    "none: …"."""
    return [abs(float(x)) for x in re.findall(r"([+-]\d+(?:\.\d+)?) pp\b", paper)]


def detectable(value: str, paper: str) -> str:
    """The smallest effect a row could tell from zero, its interval's half-width ("3.0 pp"), marked when it is
    wider than every effect the paper quotes for it: then a tie was the only possible outcome had the paper's
    effect been the truth."""
    hw = half_width(value)
    if hw is None:
        return "—"
    width, unit, decimals = hw
    text = f"{width:.{decimals}f}{unit}"
    effects = paper_effects(paper)
    if unit.strip() == "pp" and effects and width >= max(effects):
        text += " (wider than the paper's effect)"
    return text


# --------------------------------------------------------------------------- baselines
# Notes on a baseline that has not learned, where the chapter says what the win then shows
AT_CHANCE = {r"^balanced β beats β=0$": "β = 0 is distillation alone; the win says only that the DR term trains the extractor"}


def baseline_check(claim: str, text, ok) -> str:
    """The chapter's check that a comparison's baseline learned at all, as one cell: "—" where the chapter
    has none, "learned: <accuracy>" or "not learned: <accuracy>; <what the win then shows>"."""
    if not isinstance(ok, str):
        return "—"
    if ok == "yes":
        return f"learned: {text}"
    note = next((n for p, n in AT_CHANCE.items() if re.search(p, claim)),
                "a win over a model that has not learned shows only that the other side does")
    return f"not learned ({ok.removeprefix('no: ')}): {text}; {note}"


# --------------------------------------------------------------------------- folds
IDENTICAL, SAME_RUNS, BOOTSTRAP = "identical by construction", "the same runs counted twice", "a per-seed client bootstrap"
# chapter 03, section 4: both losses start from one shared global model, so local − global on the unobserved
# classes differs from the local accuracy there by the same global accuracy on both sides
SHARED_MODEL = {"same model: DR's local accuracy on unobserved classes below CE's":
                "same model: DR loses more unobserved-class accuracy than CE (local − global)"}
# chapter 07's base point (10 of 100 clients per round, 1 local epoch) is run in the participation and the
# epochs sweep roots alike: the same configuration and seeds, so the same runs
BASE_POINT = (r"^FedDr\+ beats (\w+) at 1 local epochs$", "FedDr+ beats {} at participation 0.1")
RESTATES = "… the same"  # chapter 08: a claim over one seed's clients, restating the claim above it


def fold(rows: pd.DataFrame, i: int) -> tuple[int, str] | None:
    """(index of the row that row ``i`` repeats, why) for a row that is not a distinct comparison, else None.
    A row identical by construction, or the same runs, must carry the same value as the row it repeats."""
    r = rows.loc[i]
    same = rows[(rows["chapter"] == r["chapter"]) & (rows["setting"] == r["setting"]) & (rows.index != i)]
    m = re.match(BASE_POINT[0], r["claim"])
    if r["chapter"] == "03_dr_forgets_unseen" and r["claim"] in SHARED_MODEL:
        target, why = same[same["claim"] == SHARED_MODEL[r["claim"]]], IDENTICAL
    elif r["chapter"] == "07_sensitivity" and m:
        target, why = same[same["claim"] == BASE_POINT[1].format(m[1])], SAME_RUNS
    elif r["claim"].startswith(RESTATES):
        target, why = same[(same.index < i) & ~same["claim"].str.startswith(RESTATES)].tail(1), BOOTSTRAP
    else:
        return None
    if target.empty:
        return None
    j = int(target.index[0])
    if why != BOOTSTRAP and rows.loc[j, "value ± interval"] != r["value ± interval"]:
        raise ValueError(f"{r['chapter']}: {r['claim']!r} ({r['value ± interval']}) should equal {rows.loc[j, 'claim']!r} "
                         f"({rows.loc[j, 'value ± interval']}): {why}")
    return j, why


def number(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with "#" (each distinct comparison's number, in order; a folded row takes the number of the row
    it repeats) and "folded" (why a row is folded, "" for a distinct one)."""
    folds = {i: fold(rows, i) for i in rows.index}
    ids, n = {}, 0
    for i in rows.index:
        if folds[i] is None:
            n += 1
            ids[i] = n
    out = rows.copy()
    out["#"] = [ids[i] if folds[i] is None else ids.get(folds[i][0], 0) for i in rows.index]
    out["folded"] = ["" if folds[i] is None else folds[i][1] for i in rows.index]
    return out


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

    m = re.match(BEATS, claim)
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
    """One row per testable row a chapter credits to the paper, over every chapter's claims table, with its
    checked source, the paper's number, the paper-scale result, the baseline check, the detectable effect
    and its fold ("#", "folded")."""
    import feddr_kit as fk

    rows = pd.concat(list(tables.values()), ignore_index=True) if tables else pd.DataFrame(columns=COLUMNS + ["chapter"])
    rows = rows.reindex(columns=list(dict.fromkeys([*rows.columns, BASELINE_TEXT, BASELINE_OK])))
    rows = rows[rows["source"].isin(ON_THE_CARD) & (rows["verdict"] != fk.stats.UNTESTABLE)].reset_index(drop=True)
    rows["source"] = [source(r["chapter"], r["claim"], r["setting"], r["source"]) for _, r in rows.iterrows()]
    rows["paper"] = [paper_number(r["chapter"], r["claim"], r["setting"]) for _, r in rows.iterrows()]
    runs = scale if scale is not None else paper_scale_rows()
    rows["paper scale"] = [paper_scale_result(r["chapter"], r["claim"], r["setting"], runs) for _, r in rows.iterrows()]
    rows["baseline"] = [baseline_check(r["claim"], r[BASELINE_TEXT], r[BASELINE_OK]) for _, r in rows.iterrows()]
    rows["detectable"] = [detectable(r["value ± interval"], r["paper"]) for _, r in rows.iterrows()]
    return number(rows)


def _counts(rows: pd.DataFrame) -> str:
    """"3 held, 1 did not hold, …" over ``rows``, in the page's order of verdicts."""
    import feddr_kit as fk

    order = [fk.stats.HELD, fk.stats.NOT_HELD, fk.stats.TIE_AGAINST, fk.stats.TIE_TOWARD, fk.stats.TIE, fk.stats.UNTESTABLE]
    counts = rows["verdict"].value_counts()
    return ", ".join(f"{counts[v]} {v}" for v in order if v in counts) or "none"


def summary(rows: pd.DataFrame) -> str:
    """The page's count: rows, distinct comparisons, what was folded and why, then the verdicts of the
    distinct comparisons, the paper's claims apart from the course's own tests."""
    import feddr_kit as fk

    distinct = rows[rows["folded"] == ""]
    folded = rows["folded"].value_counts()
    why = {IDENTICAL: "identical by construction (chapter 03, at both lrs: from one shared global model, \"DR's local "
                      "accuracy on unobserved classes below CE's\" is \"DR loses more unobserved-class accuracy "
                      "(local − global)\")",
           SAME_RUNS: "the same runs counted twice (chapter 07's base point, as \"participation 0.1\" and "
                      "\"1 local epoch\")",
           BOOTSTRAP: "per-seed client bootstraps restating the claim above them (chapter 08)"}
    parts = [f"{folded[k]} {text}" for k, text in why.items() if k in folded]
    paper, own = distinct[distinct["source"] == "paper"], distinct[distinct["source"] != "paper"]
    ties = paper[paper["verdict"].map(fk.stats.is_tie) & paper["detectable"].str.contains("wider than the paper's")]
    chance = distinct[distinct["baseline"].str.startswith("not learned") & (distinct["verdict"] == fk.stats.HELD)]
    text = f"In all, {len(rows)} rows and {len(distinct)} distinct comparisons"
    if parts:
        text += f": {len(rows) - len(distinct)} rows repeat another and are folded into it ({'; '.join(parts)})"
    text += f". Of the {len(distinct)}, {len(paper)} test the paper's claims ({_counts(paper)})"
    text += f" and {len(own)} the course's own test{'s' * (len(own) != 1)} ({_counts(own)})." if len(own) else "."
    if len(ties):
        text += (f" {len(ties)} of the paper's comparisons without a finding at the margin sit on intervals wider than "
                 "the paper's own effect: had the effect been the paper's, those rows would have found nothing either.")
    if len(chance):
        text += f" {len(chance)} held over a baseline that has not learned, which says only that the other side learns."
    return text


INTRO = [
    "Every claim of the FedDr+ paper (*FedDr+: Stabilizing Dot-regression with Global Feature Distillation "
    "for Federated Learning*, Kim et al., arXiv:2406.02355) that a chapter tests, with the chapter's own "
    "interval, margin and verdict, over three seeds (or, where the column says so, a seed's 100 clients). "
    "The runs are at the teaching scale (`docs/teaching_scale.md`: a small BatchNorm CNN on CIFAR-10, 120 "
    "rounds of 10 of 100 clients, one local epoch, on a CPU; chapter 07 cuts the rounds to 40); the paper's "
    "number beside each is at its own scale, in the setting named there. A verdict is about the teaching "
    "scale only: it says whether the claim's effect shows here, not whether the paper is right at its scale, "
    "which is what the last column is for. Rows a chapter credits to the paper for a claim the paper does not "
    "make are kept as the course's own tests, labelled so and counted apart.",
    "How to read a verdict (`fk.stats.verdict`, in the words the chapters print): **held** and **did not "
    "hold** mean the whole 95 % interval lies beyond the margin, on the claim's side or on the other; "
    "**against the claim (not shown beyond the margin)** means the difference goes the other way (the "
    "interval excludes zero) without being shown as large as the margin, and its mirror, **in the claim's "
    "direction (not shown beyond the margin)**, the claimed way; **tie (zero inside the interval)** means "
    "not even the sign is known. None of these last three is a finding at the margin.",
    "How to read the columns. **#** numbers the distinct comparisons: a row that repeats another keeps its "
    "line but takes the other's number, with the reason. **source** is \"paper\" only where the paper states "
    "the claim; a row a chapter tests beside the paper's claims, such as the β-scaled control (DR at its lr "
    "times β, chapter 04) or one lr for both losses (chapter 03), is the course's own test, says why, and "
    "has no paper number. **baseline** is the chapter's check that the side a claim is measured against "
    "learned at all (chapters 05-07; \"—\" where the chapter has none): a win over a model at chance shows "
    "only that the other side learns. **detectable** is the interval's half-width, the smallest difference "
    "that row could tell from zero (to hold, a difference must clear it and the margin); where it is wider "
    "than the effect the paper reports, a tie was the only outcome the paper's effect could have given here.",
]
PROBE_INTRO = (
    "The rows whose setting starts \"drift probe\" come from the drift probe (`results/drift_probe.py`, "
    "pre-registered before its first run; its report is `docs/drift.md`), which chapters 04 (section 6) and 05 "
    "(section 7) show after their claims tables: FedDr+, FedAvg and the β-scaled control at shard s = 2 for 80 "
    "rounds, in four cells that cross `cnn_bn` with `cnn_nobn` (the same network without BatchNorm) and one local "
    "epoch with five, over seeds 1-3 (seed 0 chose the lrs), with 95 % paired t intervals and a 0.5 pp margin; "
    "late accuracy is the mean of the last three evaluations. Each row sits under the chapter that shows it: C1, "
    "FedDr+ against FedAvg in late accuracy, is the paper's claim (chapter 05; the paper's number is its s=2 "
    "result, with VGG-11, which has no BatchNorm, and ten local epochs); C2 and C3, FedDr+ against the β-scaled "
    "control in late accuracy and in the local models' accuracy on their unseen classes, are the course's own "
    "tests (chapter 04). C4 and C5 (FedAvg's drift at five epochs against one, and whether five epochs or "
    "removing BatchNorm widens C1's gap) are the probe's own hypotheses and, like every chapter's hypotheses, are "
    "left to `docs/drift.md`. A cell's rows appear once all its verdict seeds are in, and never before: a "
    "comparison that reads a cell still running has no row, and one that needs a method the lr rule found no "
    "working lr for is untestable and, like every untestable row, left out."
)
TABLE = ["#", "chapter", "claim", "source", "setting", "n", "effect ± 95 % interval", "margin", "verdict", "baseline",
         "detectable", "the paper's number", "paper scale"]


def _cells(r: dict) -> list[str]:
    """One table row's cells, in ``TABLE``'s order."""
    first = str(r["#"]) if not r["folded"] else f"= {r['#']} ({r['folded']})"
    cells = [first, r["chapter"][:2], r["claim"], r["source"], r["setting"], r["seeds"], r["value ± interval"],
             r["margin"], r["verdict"], r["baseline"], r["detectable"], r["paper"], r["paper scale"]]
    return [str(c).replace("|", "\\|") for c in cells]


def markdown(rows: pd.DataFrame, probe_done: list[str] | None = None) -> str:
    """The scorecard page: how to read it, which of the drift probe's cells are in (``probe_done``, their labels;
    not said when None), the count of distinct comparisons and their verdicts, the table."""
    lines = ["# Scorecard: the paper's claims at the teaching scale", "",
             "<!-- written by results/scorecard.py from the chapters' claims tables: do not edit by hand -->", ""]
    for paragraph in INTRO:
        lines += [paragraph, ""]
    lines += [PROBE_INTRO if probe_done is None else f"{PROBE_INTRO} {probe_status(probe_done)}", ""]
    lines += [summary(rows), "", "| " + " | ".join(TABLE) + " |", "|" + "---|" * len(TABLE)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows.to_dict("records")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with docs/scorecard.md instead of writing it")
    args = parser.parse_args()
    probe = drift_report().load()
    extra = probe_tables(probe)  # each after its chapter's own rows, as the chapter shows them
    rows = scorecard({ch: pd.concat([chapter_claims(ch, *how), extra.get(ch)], ignore_index=True)
                      for ch, how in CHAPTERS.items()})
    page = markdown(rows, probe_done=drift_report().complete_cells(probe))
    if args.check:
        same = OUT.is_file() and OUT.read_text() == page
        print("docs/scorecard.md is up to date" if same else "docs/scorecard.md differs from what the chapters give: "
              "run PYTHONPATH=. python results/scorecard.py")
        return 0 if same else 1
    OUT.write_text(page)
    print(f"wrote {OUT.relative_to(REPO)}: {len(rows)} rows, {(rows['folded'] == '').sum()} distinct comparisons")
    return 0


if __name__ == "__main__":
    sys.exit(main())
