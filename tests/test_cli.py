"""The command line: ``python -m sb3_ippo train`` and ``python -m sb3_ippo evaluate``."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from sb3_ippo import IPPO
from sb3_ippo.cli import literal, main, parse_env_kwargs

TINY = ["--n-epochs", "2", "--n-episodes", "2", "--policy-kwargs", "dict(net_arch=[16])"]


def test_train_writes_model_log_curve_and_run_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    options = ["--timesteps", "300", "--n-envs", "2", "--eval-episodes", "2", "--no-progress-bar", *TINY]
    main(["train", *options, "--out", str(out)])
    assert {path.name for path in out.iterdir()} == {"model.zip", "progress.csv", "learning_curve.png", "run.json"}
    run = json.loads((out / "run.json").read_text())
    assert run["env"] == "mpe2.simple_spread_v3" and run["env_kwargs"] == {"N": 3, "max_cycles": 25}
    assert run["hyperparameters"]["n_epochs"] == 2 and run["hyperparameters"]["policy_kwargs"] == {"net_arch": [16]}
    model = IPPO.load(out / "model.zip")
    assert model.n_epochs == 2 and model.num_timesteps >= 300
    assert "Team return over 2 evaluation episodes" in capsys.readouterr().out


def test_evaluate_reads_the_env_from_the_run_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "adversary"
    options = ["--env", "mpe2.simple_adversary_v3", "--env-kwargs", "max_cycles=10", "--timesteps", "100", "--n-envs", "1"]
    main(["train", *options, "--out", str(out), "--eval-episodes", "0", "--no-progress-bar", *TINY])
    capsys.readouterr()
    main(["evaluate", str(out / "model.zip"), "--episodes", "2"])
    printed = capsys.readouterr().out
    assert "mpe2.simple_adversary_v3" in printed and "'max_cycles': 10" in printed and "team return over 2 episodes" in printed


def test_module_entry_point_shows_help() -> None:
    result = subprocess.run([sys.executable, "-m", "sb3_ippo", "train", "--help"], capture_output=True, text=True, check=True)
    assert "--timesteps" in result.stdout and "--n-episodes" in result.stdout and "--max-version-lag" in result.stdout


def test_unknown_env_module_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SystemExit, match=r"Cannot import the env module 'mpe2\.no_such_env'"):
        main(["train", "--env", "mpe2.no_such_env", "--out", str(tmp_path)])


def test_evaluating_a_missing_model_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SystemExit, match="No model at"):
        main(["evaluate", str(tmp_path / "nothing.zip")])


def test_options_parse_python_literals() -> None:
    assert literal("3e-4") == 3e-4 and literal("None") is None and literal("True") is True
    assert literal("dict(net_arch=[64, 64])") == {"net_arch": [64, 64]}
    assert literal("cpu") == "cpu"
    assert parse_env_kwargs(["N=3", "continuous_actions=True"]) == {"N": 3, "continuous_actions": True}
