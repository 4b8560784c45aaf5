"""A config file means what the same flags typed mean: numbers written as text are numbers, and
``out_dir: none`` is refused like ``--out-dir none`` instead of making a folder called none."""
import pytest

import feddr_kit as fk
from feddr_kit.__main__ import build_parser, command_config, main
from feddr_kit.errors import FeddrKitError
from test_reliability import error_lines


def config_from(tmp_path, text: str, name: str = "run.yaml") -> fk.Config:
    file = tmp_path / name
    file.write_text(text)
    return command_config(vars(build_parser(typed_only=True).parse_args(["run", "--config", str(file)])), str(file))


def test_numbers_that_yaml_reads_as_text_are_numbers(tmp_path):
    # PyYAML (YAML 1.1) reads 1e-3 without a dot as the string "1e-3"
    cfg = config_from(tmp_path, "dataset: synthetic\nlr: 1e-3\nweight_decay: 5e-4\nrounds: 1e1\nlr_decay_at: [5e-1]\n")
    assert (cfg.lr, cfg.weight_decay, cfg.rounds, cfg.lr_decay_at) == (1e-3, 5e-4, 10, (0.5,))
    assert type(cfg.rounds) is int and type(cfg.lr) is float


def test_numbers_as_json_strings_are_numbers_too(tmp_path):
    cfg = config_from(tmp_path, '{"lr": "0.05", "seed": "7", "perfedavg_beta": "2e-2"}', "run.json")
    assert (cfg.lr, cfg.seed, cfg.perfedavg_beta) == (0.05, 7, 0.02)


@pytest.mark.parametrize("text, field", [("lr: fast\n", "lr"), ("rounds: '2.5'\n", "rounds"), ("seed: 1e-3\n", "seed"),
                                         ("lr: .nan\n", "lr"), ("lr: nan\n", "lr")])
def test_text_that_is_not_a_number_of_the_fields_kind_is_refused_naming_the_field(tmp_path, text, field):
    with pytest.raises(FeddrKitError, match=f"^{field} must be"):
        config_from(tmp_path, text)


def test_text_fields_stay_text(tmp_path):
    cfg = config_from(tmp_path, "dataset: synthetic\ndata_path: '123'\nregularizer: none\n")
    assert cfg.data_path == "123" and cfg.regularizer == "none"


@pytest.mark.parametrize("word", ["none", "None", "NONE"])
def test_out_dir_none_in_a_config_file_is_refused_like_the_flag(tmp_path, monkeypatch, capsys, word):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(f"dataset: synthetic\nrounds: 1\nout_dir: {word}\n")
    code = main(["run", "--config", "run.yaml"])
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "out_dir" in line and "not taken as a folder name" in line, line
    assert not (tmp_path / word).exists()
    with pytest.raises(FeddrKitError, match="not taken as a folder name"):
        fk.Config.from_file(tmp_path / "run.yaml")


def test_out_dir_null_in_a_config_file_saves_nothing(tmp_path):
    assert config_from(tmp_path, "out_dir: null\n").out_dir is None


def test_channels_last_auto_reads_as_none_from_the_flags_and_from_a_file(tmp_path):
    """``channels_last`` is True, False or None (auto, the default): the command line and a config file both say
    auto for None, and anything else is one line naming the field."""
    def flag(*typed: str):
        return vars(build_parser().parse_args(["run", *typed]))["channels_last"]

    assert [flag(), flag("--channels-last"), flag("--channels-last", "false"), flag("--channels-last", "Auto")] == [
        None, True, False, None]
    assert [config_from(tmp_path, f"channels_last: {word}\n").channels_last
            for word in ("auto", "null", "false", "true")] == [None, None, False, True]
    assert config_from(tmp_path, '{"channels_last": "auto"}', "run.json").channels_last is None
    with pytest.raises(FeddrKitError, match="^channels_last must be True, False or None"):
        config_from(tmp_path, "channels_last: sometimes\n")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--channels-last", "sometimes"])
