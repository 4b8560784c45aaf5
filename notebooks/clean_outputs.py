"""Tidy executed notebooks in place (run_all.sh calls it after each execution).

* Live widgets (``interact``, tqdm bars) do not survive the kernel: their outputs and the notebook's
  widget state are dropped (the cell after each widget draws the same figure statically). A widget
  displayed by ``fk.teaching.interact`` keeps its plain-text fallback, which says to run the cell to
  get the controls: the committed notebook then shows what a saved and reopened copy shows.
* A figure's ``text/plain`` fallback (``<Figure size 1400x480 with 4 Axes>``) is dropped where the
  image itself is stored: it says nothing the image does not, and its ``…0x480`` reads like a memory
  address to anyone scanning outputs for them.
* Likewise a generated Markdown output's fallback (``<IPython.core.display.Markdown object>``): the
  rendered text is stored beside it.

    python notebooks/clean_outputs.py notebooks/03_dr_forgets_unseen.ipynb [...]
"""
import sys

import nbformat

from feddr_kit.teaching import SAVED_WIDGET_NOTE


def clean(path: str) -> None:
    """Rewrite the notebook at ``path`` without widget outputs (keeping ``fk.teaching.interact``'s note),
    widget state or figure and Markdown text fallbacks."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                if str(data.get("text/plain", "")) != SAVED_WIDGET_NOTE:
                    continue
                out.data = {"text/plain": SAVED_WIDGET_NOTE}
            if "image/png" in data and str(data.get("text/plain", "")).startswith("<Figure size"):
                del data["text/plain"]
            if "text/markdown" in data and str(data.get("text/plain", "")).startswith("<IPython.core.display.Markdown"):
                del data["text/plain"]
            outputs.append(out)
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        clean(p)
