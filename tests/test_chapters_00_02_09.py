"""Chapters 00, 01, 02 and 09 as they read in JupyterLab: maths MathJax renders, widgets that print
nothing but their figure and say how to get them back after a reopen, the paper's tables and figures
named by label, and chapter 01's force explorer readable at every slider position."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from feddr_kit import plots, progress, teaching  # noqa: E402
from feddr_kit.teaching import SAVED_WIDGET_NOTE  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = [NOTEBOOKS / f"{stem}.ipynb" for stem in ("00_quickstart", "01_ce_pull_push", "02_simplex_etf", "09_flower")]
NUMBERED = re.compile(r"\b(Tables?|Figures?|Fig\.)\s+\d")  # "Table 3", "Figure 6", "Fig. 6"


def _read(path):
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_markdown_maths_uses_macros_mathjax_knows(path):
    """JupyterLab's MathJax has no \\bm (it shows it as red raw text); \\boldsymbol is the portable one."""
    for i, cell in enumerate(_read(path).cells):
        if cell.cell_type == "markdown":
            assert not re.search(r"\\bm\b", cell.source), f"cell {i} uses \\bm"


def _interact_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls of ``interact(...)`` (ipywidgets') or ``teaching.interact(...)`` (the kit's) in a cell."""
    def name(f):
        return f.id if isinstance(f, ast.Name) else f"{name(f.value)}.{f.attr}" if isinstance(f, ast.Attribute) else ""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and name(n.func) in ("interact", "teaching.interact")]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_widget_returns_nothing_and_has_a_note_under_it(path):
    """interact displays its function's return value on every move, so the function returns None
    (it ends with plt.show()); the saved notebook keeps no widget state, so a markdown note right
    under the cell says what the cell shows when reopened and to run it again: the kit's
    ``teaching.interact`` saves its SAVED_WIDGET_NOTE (quoted by the note), ipywidgets' own a repr
    or "model not found"."""
    cells = _read(path).cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or "interact(" not in cell.source:
            continue
        tree = ast.parse(cell.source)
        calls = _interact_calls(tree)
        assert calls, f"cell {i}: interact is not called"
        for call in calls:
            target = call.args[0]
            assert isinstance(target, ast.Name), f"cell {i}: interact a function defined in the cell, not {ast.unparse(target)}"
            (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == target.id]
            last = fn.body[-1]
            assert isinstance(last, ast.Expr) and ast.unparse(last.value) == "plt.show()", \
                f"cell {i}: {fn.name} must end with plt.show()"
            assert not any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn)), \
                f"cell {i}: {fn.name} must return nothing"
        note = cells[i + 1]
        assert note.cell_type == "markdown", f"cell {i}: no note under the widget"
        if all(ast.unparse(c.func) == "teaching.interact" for c in calls):  # both things a reopened cell can show
            assert SAVED_WIDGET_NOTE.split(":")[0] in note.source and "model not found" in note.source, \
                f"cell {i}: the note must quote what the saved cell shows"
        else:
            assert "model not found" in note.source and "run it" in note.source, \
                f"cell {i}: no note under the widget saying to re-run it"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_saved_widget_cell_shows_the_note(path):
    """What git stores for a teaching.interact cell is what a saved copy reopened without a kernel shows:
    the note, as plain text, and no widget view."""
    for i, cell in enumerate(_read(path).cells):
        if cell.cell_type == "code" and "teaching.interact(" in cell.source:
            assert [o.get("data", {}) for o in cell.outputs] == [{"text/plain": SAVED_WIDGET_NOTE}], f"cell {i}"


def test_kit_interact_saves_the_note_and_keeps_the_live_widget(monkeypatch):
    """teaching.interact displays the widget (its view, for a live front end) with the note as its plain-text
    fallback, calls the function once as ipywidgets' interact does, and returns nothing."""
    from ipywidgets import IntSlider

    shown, calls = [], []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj._repr_mimebundle_()))
    out = teaching.interact(lambda k: calls.append(k), k=IntSlider(value=3, min=0, max=5))
    assert out is None and calls == [3]
    (bundle,) = shown
    assert bundle["text/plain"] == SAVED_WIDGET_NOTE and "model_id" in bundle["application/vnd.jupyter.widget-view+json"]
    shown.clear()
    teaching.interact(lambda k: calls.append(k), manual=True, k=IntSlider(value=4))
    assert calls == [3] and shown[0]["text/plain"] == SAVED_WIDGET_NOTE  # manual: nothing runs until the button


def test_kit_interact_under_a_batch_executor_shows_the_note_and_builds_no_widget(monkeypatch):
    """Under papermill, nbconvert or nbval no front end draws the controls: teaching.interact displays the note
    as plain text, builds no widget and calls nothing (the chapter's next cell calls the function)."""
    import ipywidgets
    from ipywidgets import IntSlider

    shown, calls = [], []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append((obj, raw)))
    monkeypatch.setattr(ipywidgets, "interactive", lambda *a, **k: pytest.fail("a widget was built"))
    monkeypatch.delenv("FEDDR_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "_in_kernel", lambda: True)
    monkeypatch.setattr(progress, "_parent_command", lambda: "/venv/bin/python /venv/bin/papermill ch.ipynb out.ipynb")
    assert progress.batch_kernel() and progress.kind() == "lines"
    assert teaching.interact(lambda k: calls.append(k), k=IntSlider(value=3)) is None
    assert calls == [] and shown == [({"text/plain": SAVED_WIDGET_NOTE}, True)]
    monkeypatch.setattr(progress, "_parent_command", lambda: "/venv/bin/python /venv/bin/jupyter-lab")
    assert not progress.batch_kernel() and progress.kind() == "widgets"


def test_clean_outputs_keeps_only_the_note_of_a_widget(tmp_path):
    """clean_outputs.py drops a widget's view (and any other widget output, e.g. a progress bar), keeping the
    kit's note as plain text."""
    import sys

    nb = nbformat.v4.new_notebook()
    view = {"application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0, "model_id": "x"}}
    nb.cells = [nbformat.v4.new_code_cell("teaching.interact(f)", outputs=[
        nbformat.v4.new_output("display_data", data={**view, "text/plain": SAVED_WIDGET_NOTE}),
        nbformat.v4.new_output("display_data", data={**view, "text/plain": "  0%|          | 0/3"})])]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import clean_outputs
    finally:
        sys.path.remove(str(NOTEBOOKS))
    clean_outputs.clean(str(path))
    assert [o["data"] for o in nbformat.read(path, as_version=4).cells[0].outputs] == [{"text/plain": SAVED_WIDGET_NOTE}]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_paper_tables_and_figures_are_named_by_label(path):
    """Table and figure numbers differ between the paper's versions: a cell that gives one also gives
    the LaTeX label."""
    for i, cell in enumerate(_read(path).cells):
        if cell.cell_type == "markdown" and NUMBERED.search(cell.source):
            assert re.search(r"`(tab|fig|apptab):", cell.source), f"cell {i} numbers a table or figure without its label"


def test_quickstart_finds_results_wherever_it_is_started():
    """fk.repo searches upward from the working directory, then asks the installed package: the working
    directory alone (papermill runs in the caller's folder) or the package alone (a non-editable install lives
    in site-packages) each miss a case. tests/test_chapter_paths.py runs the cell from each place."""
    source = "\n".join(c.source for c in _read(CHAPTERS[0]).cells if c.cell_type == "code")
    assert "RESULTS = fk.repo.results()" in source
    assert "Path.cwd()" not in source and "fk.__file__" not in source


def test_force_explorer_default_is_unchanged():
    ax = plots.force_explorer(angle_deg=20.0, norm=10.0)
    assert "arrows x" not in ax.get_title()
    assert ax.get_xlim()[1] == pytest.approx(1.2 * 10.0, rel=0.05)  # the view spans the feature, arrows true size
    plt.close("all")


@pytest.mark.parametrize("angle, norm, lr", [(20.0, 10.0, 0.5), (120.0, 8.0, 0.5), (150.0, 1.0, 0.05), (150.0, 0.2, 2.0)])
def test_force_explorer_magnify_keeps_arrows_readable(angle, norm, lr):
    """With magnify=True the longest arrow is at least a tenth of the view's half-width, or the factor
    has reached its cap of 1000 (a force of about zero stays a dot)."""
    ax = plots.force_explorer(angle_deg=angle, norm=norm, lr=lr, magnify=True)
    reach = ax.get_xlim()[1]
    arrows = [a for a in ax.texts if hasattr(a, "xy") and hasattr(a, "xyann")]
    longest = max(((a.xy[0] - a.xyann[0]) ** 2 + (a.xy[1] - a.xyann[1]) ** 2) ** 0.5 for a in arrows
                  if a.arrow_patch is not None and tuple(map(float, a.xyann)) != (0.0, 0.0))
    title = ax.get_title()
    k = float(title.rsplit("arrows x ", 1)[1]) if "arrows x" in title else 1.0
    assert longest >= 0.1 * reach or k == 1000
    plt.close("all")


@pytest.mark.parametrize("x, nice", [(1.0, 1.0), (1.9, 1.0), (2.0, 2.0), (7.3, 5.0), (10.0, 10.0), (999.0, 500.0)])
def test_nice_floor(x, nice):
    assert plots._nice_floor(x) == nice
