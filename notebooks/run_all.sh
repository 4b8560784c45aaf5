#!/usr/bin/env bash
# Re-execute the chapter notebooks in place with their default parameters, so that the stored
# outputs are exactly what the code produces. From the repository root:
#
#     bash notebooks/run_all.sh                       # every chapter
#     bash notebooks/run_all.sh 03_dr_forgets_unseen.ipynb   # just one
#
# Uses .venv/bin/python unless PYTHON is set; FEDDR_DATA_DIR defaults to ../shared/data when that
# folder exists (as in CI), else the kit's own default (the repository's data/, downloading when online).
# Cell timings are not recorded, and clean_outputs.py then drops live widget outputs (each `interact` cell,
# progress bars), the widget state and figures' text fallbacks, so re-running gives clean diffs.
set -euo pipefail
# tqdm's notebook bars, which clean_outputs.py drops: plain progress lines would be stored as stderr
export FEDDR_PROGRESS=widgets
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
  "$PY" clean_outputs.py "$nb"  # drop live widget outputs and figures' text fallbacks
  echo "$nb: executed in $(( $(date +%s) - start )) s"
done
