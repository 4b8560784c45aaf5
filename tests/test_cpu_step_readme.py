"""README's CPU-layout table quotes benchmarks/cpu_step.py's measured CSV (one thread), cell by cell."""
import re
from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_readme_cpu_table_is_the_benchmark_csv():
    csv = pd.read_csv(REPO_ROOT / "results" / "cpu_step.csv")
    one = csv[csv["machine"].str.contains(r"\b1 threads\b")].set_index(["model", "layout"])
    readme = (REPO_ROOT / "README.md").read_text()
    rows = re.findall(r"^\s*\| (cnn\w*) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \|$", readme, flags=re.M)
    assert {r[0] for r in rows} == set(one.index.get_level_values("model"))
    for model, nchw, nhwc, plain, ratio in rows:
        assert int(nchw) == round(one.loc[(model, "nchw"), "kit_images_per_s"])
        assert int(nhwc) == round(one.loc[(model, "nhwc"), "kit_images_per_s"])
        assert int(plain) == round(one.loc[[(model, "nchw"), (model, "nhwc")], "plain_images_per_s"].max())
        assert float(ratio) == round(one.loc[(model, "nhwc"), "kit_over_plain_best"], 2)
