"""Behaviours of the newer code that no other test pins, one test each: the gradient ratios' weighting,
``feature_norm`` of a batch-statistics model, ``cnn_bn``'s layers, the seed reaching the initial
weights, ``fk.load_model``'s refusal of pickled code and its untouched random state, ``show`` on an
unfinished run, TensorBoard events across a resume and an overwrite, rate-limited progress lines, a
run's open files, and a sweep that meets another run's ``config.json``. Tiny synthetic runs throughout.
"""
from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import feddr_kit as fk
from feddr_kit import instruments, progress
from feddr_kit.__main__ import main
from feddr_kit.build import build_run
from feddr_kit.errors import FeddrKitError
from feddr_kit.evaluation import Evaluator, forward_all
from feddr_kit.models import EVAL_BATCH_SIZE
from feddr_kit.streams import EVAL_TEST_SET, eval_order

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = dict(dataset="synthetic", model="cnn", num_clients=5, clients_per_round=2, shards_per_client=2, eval_every=1,
             batch_size=20, lr=0.05, seed=3, lr_gamma=1.0, rounds=2, progress=False)


# --------------------------------------------------------------------------- 1. gradient ratios
def test_round_ratios_average_over_local_steps_weighting_each_client_by_its_steps():
    def client(ratios: list[float]) -> instruments.GradientRatios:
        log = instruments.GradientRatios()
        for r in ratios:  # feature ratio r and body ratio 10 r at each step
            log.add((torch.tensor(1.0), torch.tensor(r)), (torch.tensor(1.0), torch.tensor(10 * r)))
        return log

    # one step at ratio 1, three at ratio 3: the mean over the 4 steps is 2.5 (over the 2 clients it would be 2)
    columns = instruments.round_ratios([client([1.0]), None, client([3.0, 3.0, 3.0]), instruments.GradientRatios()])
    assert columns == pytest.approx({"grad_ratio_features": 2.5, "grad_ratio_body": 25.0})
    assert instruments.round_ratios([None, instruments.GradientRatios()]) == {}


# --------------------------------------------------------------------------- 2. feature_norm of cnn_bn
def test_feature_norm_of_a_batch_statistics_model_is_over_the_test_set_in_the_fixed_order_and_batch():
    # 300 test images stored by class: three evaluation batches, each of which the fixed order mixes
    data = fk.data.synthetic(num_classes=10, train_per_class=20, test_per_class=30)
    cfg = fk.Config(**{**SMALL, "model": "cnn_bn", "algorithm": "fedavg", "rounds": 1})
    result = fk.run(cfg, data=data)
    model, algo = result.model, fk.methods.get_algorithm(result.config)
    assert model.batch_stat_norm and len(data.test_y) > EVAL_BATCH_SIZE
    order = eval_order(len(data.test_y), cfg.seed, EVAL_TEST_SET)
    with torch.no_grad():
        model.eval()
        h = torch.cat([model.features(data.normalize(data.test_x[i])) for i in order.split(EVAL_BATCH_SIZE)])
        stored_order = forward_all(model, algo, data, data.test_x)[0]  # the same batches in stored order
    expected = float(h.norm(dim=1).mean())
    assert result.history["feature_norm"].iloc[-1] == pytest.approx(expected, rel=1e-6)
    assert Evaluator(data, result.partition, cfg.seed)(model, algo)["feature_norm"] == pytest.approx(expected, rel=1e-6)
    assert float(stored_order.norm(dim=1).mean()) != pytest.approx(expected, rel=1e-3)  # the order matters


# --------------------------------------------------------------------------- 3. cnn_bn's architecture
def test_cnn_bn_is_a_space_to_depth_stem_then_conv_pool_batchnorm_relu_stages():
    model = fk.models.build_model("cnn_bn", 10)
    layers = list(model.body)
    assert type(layers[0]).__name__ == "SpaceToDepth" and type(layers[-1]).__name__ == "GlobalAvgPool"
    stages = [layers[i:i + 4] for i in range(1, len(layers) - 1, 4)]
    assert [[type(m).__name__ for m in s] for s in stages] == [["Conv2d", "MaxPool2d", "BatchNorm2d", "ReLU"]] * 3
    assert [(s[0].in_channels, s[0].out_channels, s[0].kernel_size, s[0].bias) for s in stages] == [
        (12, 48, (3, 3), None), (48, 96, (3, 3), None), (96, 192, (3, 3), None)]
    assert all(s[1].kernel_size == 2 and not s[2].track_running_stats for s in stages)  # batch statistics at eval too
    assert model.head.in_features == 192 and model.batch_stat_norm
    assert model.features(torch.zeros(2, 3, 32, 32)).shape == (2, 192)


# --------------------------------------------------------------------------- 4. the seed reaches the model
def test_the_runs_seed_reaches_the_models_initial_weights(synthetic):
    def initial(seed: int) -> dict[str, torch.Tensor]:
        return build_run(fk.Config(**{**SMALL, "seed": seed}), torch.device("cpu"), synthetic).initial_state

    a, b, again = initial(0), initial(1), initial(0)
    assert all(torch.equal(a[k], again[k]) for k in a)
    weights = [k for k in a if k.endswith("weight")]
    assert weights and all(not torch.equal(a[k], b[k]) for k in weights)


# --------------------------------------------------------------------------- 5, 6. fk.load_model
@pytest.fixture(scope="module")
def exported(tmp_path_factory, synthetic) -> Path:
    folder = tmp_path_factory.mktemp("exported")
    fk.run(fk.Config(**SMALL, out_dir=str(folder / "run")), data=synthetic)
    assert main(["export", str(folder / "run"), "--to", str(folder / "model.pt")]) == 0
    return folder


UNPICKLED = []


def _unpickle_tensor(values):  # what a pickled object runs when it is loaded: here it only leaves a trace
    UNPICKLED.append(True)
    return torch.tensor(values)


class _PickledTensor:
    def __init__(self, tensor: torch.Tensor):
        self.values = tensor.tolist()

    def __reduce__(self):
        return _unpickle_tensor, (self.values,)


def test_load_model_refuses_a_weights_file_that_holds_a_pickled_object(exported, tmp_path):
    state = torch.load(exported / "model.pt", weights_only=True)
    name = next(iter(state))
    torch.save({**state, name: _PickledTensor(state[name])}, tmp_path / "model.pt")
    (tmp_path / "model.json").write_text((exported / "model.json").read_text())
    UNPICKLED.clear()
    with pytest.raises(FeddrKitError, match=f"load_model: cannot read {tmp_path / 'model.pt'}"):
        fk.load_model(tmp_path / "model.pt")
    assert UNPICKLED == []  # the object's code never ran


def test_load_model_leaves_the_callers_random_state_untouched(exported):
    def draws() -> tuple:
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()

    for seed in (0, 1):
        torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
        expected = draws()
        torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
        fk.load_model(exported / "model.pt")
        assert draws() == expected


# --------------------------------------------------------------------------- 7. show on an unfinished run
def test_show_reports_an_unfinished_runs_last_recorded_round(tmp_path, synthetic, capsys):
    def stop_in_round_3(row):
        if row["round"] == 3:  # rounds 1 and 2 are checkpointed with their history; round 3 is not
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fk.run(fk.Config(**{**SMALL, "rounds": 4, "checkpoint_every": 1}, out_dir=str(tmp_path)), data=synthetic,
               callback=stop_in_round_3)
    history = json.loads(json.dumps(fk.rundir.read_csv(tmp_path / "history.csv", "test").to_dict("list")))
    assert history["round"] == [1, 2] and not (tmp_path / "summary.json").exists()
    capsys.readouterr()
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"unfinished run, 2 rounds recorded; test accuracy {history['test_acc'][-1]:.2%} at round 2" in out


# --------------------------------------------------------------------------- 8. TensorBoard and a resume
def test_tensorboard_keeps_the_earlier_events_on_resume_and_drops_them_on_overwrite(tmp_path, synthetic):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def steps() -> list[int]:
        events = EventAccumulator(str(tmp_path / "tb"))
        events.Reload()
        return sorted(e.step for e in events.Scalars("test_acc"))

    cfg = fk.Config(**SMALL, tensorboard=True, out_dir=str(tmp_path))
    fk.run(cfg, data=synthetic)
    assert steps() == [1, 2]
    with pytest.warns(UserWarning, match="resuming with rounds=4"):
        fk.run(cfg.replace(rounds=4), data=synthetic, resume=True)
    assert steps() == [1, 2, 3, 4]
    fk.run(cfg.replace(overwrite=True), data=synthetic)
    assert steps() == [1, 2]


# --------------------------------------------------------------------------- 9. progress lines
def test_progress_lines_are_at_most_one_per_interval(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    with progress.Lines(1000, "rounds", interval=10.0, file=out) as shown:
        for _ in range(1000):  # a thousand updates within one instant: the first line and the last only
            shown.update(1)
    assert len(out.getvalue().splitlines()) == 2
    out = io.StringIO()
    with progress.Lines(100, "rounds", interval=10.0, file=out) as shown:
        for _ in range(100):  # one update a second for 100 s: a line at 0 s, then one every 10 s
            now[0] += 1.0
            shown.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 10 and lines[-1].startswith("rounds: 100/100")


# --------------------------------------------------------------------------- 10. no file left open
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through Linux's /proc/self/fd")
def test_a_run_leaves_no_file_open(tmp_path, synthetic):
    def open_files() -> dict[str, str]:
        found = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                found[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor, closed already
                pass
        return found

    fk.run(fk.Config(**SMALL, out_dir=str(tmp_path / "first")), data=synthetic)  # whatever a first run loads once
    before = open_files()
    fk.run(fk.Config(**SMALL, out_dir=str(tmp_path / "run")), data=synthetic)
    after = open_files()
    assert not [p for p in after.values() if str(tmp_path) in p]
    assert len(after) == len(before), set(after.values()) ^ set(before.values())


# --------------------------------------------------------------------------- 11. a sweep meets another run
def test_a_sweep_refuses_a_folder_whose_config_json_holds_another_run_without_point_json(tmp_path, synthetic):
    base = {k: v for k, v in SMALL.items() if k not in ("seed", "progress")}
    done = fk.sweep.run(base, {"algorithm": ["fedavg"]}, [0], tmp_path, data=synthetic, progress=False)
    folder = tmp_path / done["name"].iloc[0]
    config = json.loads((folder / "config.json").read_text())
    for p in folder.iterdir():  # what a run that stopped before its first checkpoint leaves, of another lr
        if p.name != ".lock":
            p.unlink()
    (folder / "config.json").write_text(json.dumps({**config, "lr": 0.02}))
    with pytest.raises(FeddrKitError, match=r"holds another run \(lr=0.02 there but the sweep asks lr=0.05\)"):
        fk.sweep.run(base, {"algorithm": ["fedavg"]}, [0], tmp_path, data=synthetic, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    assert json.loads((folder / "config.json").read_text())["lr"] == 0.02
