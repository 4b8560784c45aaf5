"""The GPU check script on CPU: its steps run at tiny size, and its tables are built from its JSON lines."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from chapter_cells import NOTEBOOKS, cifar10_available

REPO_ROOT = NOTEBOOKS.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_tables_keep_the_last_reading_per_device_and_skip_failures(tmp_path):
    row = dict(check="round_time", model="vgg11", algorithm="feddr+", engine="batched", gpu_busy_pct=90.0, setting="s")
    write_jsonl(tmp_path / "a.jsonl", [
        {"check": "start", "device": "GPU X"},
        {**row, "device": "GPU X", "sec_per_round": 2.0},
        {**row, "device": "GPU X", "engine": "serial", "sec_per_round": 5.0},
        {**row, "device": "GPU X", "engine": "dataloader", "error": "RuntimeError: boom"},
        {"check": "paper_regime", "device": "GPU X", "setting": "vgg11-s2", "round": 1, "grad_ratio_features": 0.01},
    ])
    write_jsonl(tmp_path / "b.jsonl", [
        {**row, "device": "GPU X", "sec_per_round": 1.5},  # the same timing again: the later reading wins
        {**row, "device": "cpu (2 cores, 2 threads)", "sec_per_round": 9.0, "gpu_busy_pct": None},
    ])
    written = gpu_check.write_tables([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["paper_regime_gpu_x.csv", "round_time_cpu_2_cores_2_threads.csv", "round_time_gpu_x.csv"]
    gpu = pd.read_csv(tmp_path / "round_time_gpu_x.csv")
    assert dict(zip(gpu.engine, gpu.sec_per_round)) == {"batched": 1.5, "serial": 5.0}  # no failed dataloader row
    assert "gpu_busy_pct" not in pd.read_csv(tmp_path / "round_time_cpu_2_cores_2_threads.csv")
    assert pd.read_csv(tmp_path / "paper_regime_gpu_x.csv").grad_ratio_features.tolist() == [0.01]


@pytest.mark.skipif(not cifar10_available(), reason="the feature-regime step needs real CIFAR-10")
def test_tiny_run_logs_every_step_it_had_time_for(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--out", str(tmp_path),
                    "--budget", "60", "--regime-seconds", "1", "--steps", "determinism", "vgg11-regime", "peak-memory"],
                   check=True, env=env, capture_output=True, text=True)
    records = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    checks = [r["check"] for r in records]
    assert checks[0] == "start" and checks[-1] == "done"
    determinism = [r for r in records if r["check"] == "determinism"]
    assert [(r["engine"], r["deterministic"]) for r in determinism] == [("batched", True), ("serial", True), ("batched", False)]
    assert all(r["identical_history"] and r["identical_weights"] for r in determinism)  # CPU kernels are deterministic
    regime = [r for r in records if r["check"] == "paper_regime"]
    assert regime and regime[0]["round"] == 1 and regime[0]["grad_ratio_features"] > 0  # stopped by its time share
    assert (tmp_path / f"paper_regime_{gpu_check.slug(regime[0]['device'])}.csv").exists()
