#!/usr/bin/env bash
# Re-execute the chapter notebooks in place with their default parameters, so that the stored
# outputs are exactly what the code produces. From the repository root:
#
#     bash notebooks/run_all.sh                       # every chapter, 00 to 07 (about 10 min on 2 idle CPU cores)
#     bash notebooks/run_all.sh 03_dr_forgets_unseen.ipynb   # just one
#
# Uses .venv/bin/python unless PYTHON is set; FEDDR_DATA_DIR defaults to ../shared/data when that
# folder exists (as in CI), else the kit's own default (the repository's data/, downloading when online).
# Cell timings are not recorded, and live widget outputs (each `interact` cell, progress bars) and the
# widget state are dropped afterwards (the cell after it draws the same figure statically), so re-running gives
# clean diffs.
set -euo pipefail
cd "$(dirname "$0")"
REPO="$(cd .. && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
if [ -z "${FEDDR_DATA_DIR:-}" ] && [ -d "$REPO/../shared/data" ]; then
  export FEDDR_DATA_DIR="$(cd "$REPO/../shared/data" && pwd)"
fi

if [ "$#" -gt 0 ]; then notebooks=("$@"); else notebooks=([0-9][0-9]_*.ipynb); fi
for nb in "${notebooks[@]}"; do
  nb="$(basename "$nb")"
  start=$(date +%s)
  "$PY" -m jupyter nbconvert --to notebook --execute --inplace \
    --ExecutePreprocessor.kernel_name=python3 \
    --ExecutePreprocessor.timeout=1800 \
    --ExecutePreprocessor.record_timing=False \
    "$nb"
  "$PY" - "$nb" <<'PY'
import sys

import nbformat

path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
for cell in nb.cells:
    if cell.cell_type == "code":  # live widgets (interact, tqdm bars) do not survive the kernel: drop them
        cell.outputs = [out for out in cell.get("outputs", [])
                        if "application/vnd.jupyter.widget-view+json" not in out.get("data", {})]
nb.metadata.pop("widgets", None)
nbformat.write(nb, path)
PY
  echo "$nb: executed in $(( $(date +%s) - start )) s"
done
