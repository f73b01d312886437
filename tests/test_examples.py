"""Every example runs end to end at a tiny size: it trains (at least one update), saves, loads and evaluates.

The examples run in this process (their ``main(argv)``), so that torch, SB3 and the envs are imported once.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import re
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(name: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], timesteps: int) -> tuple[Any, str]:
    result = load_example(name).main(["--timesteps", str(timesteps), "--eval-episodes", "2", "--out", str(tmp_path)])
    output = capsys.readouterr().out
    updates = re.search(r"Trained for (\d+) env steps \((\d+) updates\)", output)
    assert updates is not None, output
    assert int(updates.group(1)) >= timesteps
    assert int(updates.group(2)) >= 1, "the example should run at least one update at this size"
    assert len(list(tmp_path.glob("*.zip"))) == 1, "the example saves its model as one zip"
    return result, output


@pytest.mark.parametrize("name", ["simple_spread", "continuous_spread", "recurrent_spread"])
def test_team_return_example(name: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    team_return, output = run_example(name, tmp_path, capsys, timesteps=1100)
    assert isinstance(team_return, float) and math.isfinite(team_return)
    assert "Team return over 2 episodes" in output


def test_simple_adversary_example_prints_each_side(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (adversary, good), output = run_example("simple_adversary", tmp_path, capsys, timesteps=1100)
    assert math.isfinite(adversary) and math.isfinite(good)
    assert "adversary_0: observation (8,)" in output and "agent_0: observation (10,)" in output
    assert "adversary return" in output and "good agents' return" in output


# PettingZoo 1.27 deprecates importing envs as modules (pettingzoo.butterfly.pistonball_v6) in favour of
# pettingzoo.make; the example keeps the module import, which every PettingZoo this project supports has.
@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
def test_pistonball_cnn_example(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    team_return, output = run_example("pistonball_cnn", tmp_path, capsys, timesteps=400)
    assert isinstance(team_return, float) and math.isfinite(team_return)
    assert "observes Box(0, 255, (48, 48, 3), uint8)" in output


def test_side_returns_sums_each_side() -> None:
    side_returns = load_example("simple_adversary").side_returns
    assert side_returns({"adversary_0": -3.0, "agent_0": 1.0, "agent_1": 2.5}) == (-3.0, 3.5)


def test_connect_four_self_play_example(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    win_rates, output = run_example("connect_four_self_play", tmp_path, capsys, timesteps=4000)
    assert set(win_rates) == {"player_0", "player_1"} and all(0.0 <= rate <= 1.0 for rate in win_rates.values())
    assert "policy MaskedMlpPolicy" in output and "player_1 against a random player: win" in output
