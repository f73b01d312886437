"""The benchmark scripts run, at a tiny size."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from stable_baselines3 import PPO

from sb3_ippo import IPPO

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Dataclasses look their module up in sys.modules while the module runs. Once it has run, it leaves: cloudpickle
    # then sends its functions to worker processes by value, as they cannot import it by name.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_benchmarks_are_a_few_scripts_each_listed_with_its_command_in_the_readme() -> None:
    scripts = sorted(path.name for path in BENCHMARKS.glob("*.py"))
    assert len(scripts) <= 8, scripts
    readme = (BENCHMARKS / "README.md").read_text()
    for script in scripts:
        if script != "common.py":
            assert f"`{script}`" in readme and f"python benchmarks/{script}" in readme, script


def test_env_throughput_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    medians = load_benchmark("env_throughput").main(["--rounds", "2", "--steps", "5", "--n-envs", "2", "--padded-ms", "0"])
    assert set(medians) == {"plain", "dummy", "subproc"} and all(rate > 0 for rate in medians.values())
    table = capsys.readouterr().out
    assert all(f"\n{name} " in table for name in medians) and "vs plain" in table


def test_env_throughput_batched_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--batched", "--rounds", "1", "--batched-steps", "3", "--batched-copies", "2,4"]
    medians = load_benchmark("env_throughput").main(args)
    kinds = ("batched", "pettingzoo", "batched_layer", "pettingzoo_layer")
    assert set(medians) == {f"{kind}_{n}" for kind in kinds for n in (2, 4)} and min(medians.values()) > 0
    assert "learn: batched" in capsys.readouterr().out


@pytest.mark.slow
def test_env_throughput_padded_ray_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--rounds", "1", "--steps", "5", "--n-envs", "2", "--padded-ms", "0.5", "--padded-steps", "5"]
    medians = load_benchmark("env_throughput").main(args)
    assert all(medians[f"padded_{name}"] > 0 for name in ("dummy", "subproc", "ray"))
    assert "Ray overhead per vectorized step" in capsys.readouterr().out


# The comparisons with SB3 PPO + SuperSuit parameter sharing (docs/benchmarks.md), each at a tiny size.
TINY = ["--n-envs", "2", "--peer-n-steps", "25"]


def test_throughput_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    medians = load_benchmark("throughput").main(["--rounds", "1", "--timesteps", "100", "--batch-size", "50", *TINY])
    assert medians["ippo"] > 0 and medians["peer"] > 0
    assert medians["ratio"] == pytest.approx(medians["ippo"] / medians["peer"])
    assert "ratio IPPO/peer" in capsys.readouterr().out


def test_throughput_skrl_column_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # skrl writes its checkpoints into runs/ under the working folder
    medians = load_benchmark("throughput").main(
        ["--rounds", "1", "--timesteps", "50", "--batch-size", "50", "--skrl", *TINY]
    )
    assert medians["skrl"] > 0 and "ratio_skrl" in medians


def test_throughput_scaling_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    costs = load_benchmark("throughput").main(["--agents", "2", "3", "--rounds", "1", "--timesteps", "50", *TINY])
    assert set(costs) == {2, 3} and all(cost[name] > 0 for cost in costs.values() for name in ("ippo", "peer"))
    assert "IPPO/peer" in capsys.readouterr().out


def test_throughput_as_written_alternates_fresh_processes_and_reports_each_variant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    throughput = load_benchmark("throughput")
    calls = []
    monkeypatch.setattr(throughput, "run_snippet", lambda t, one_thread, out, checkout=None: calls.append(out.name) or (
        100.0 if one_thread else 90.0))
    monkeypatch.setattr(throughput, "run_cli", lambda t, folder: calls.append("cli") or 80.0)
    medians = throughput.main(["--as-written", "--rounds", "2", "--timesteps", "10"])
    assert medians == {"as_written": 90.0, "one_thread": 100.0, "cli": 80.0}
    assert calls == ["as_written.txt", "one_thread.txt", "cli", "cli", "one_thread.txt", "as_written.txt"]
    assert "0.90x one_thread" in capsys.readouterr().out


def test_learning_smoke(tmp_path: Path) -> None:
    summary = load_benchmark("learning").main(
        ["--timesteps", "200", "--seeds", "1", "--eval-episodes", "1", "--bins", "2", "--peer-batch-size", "50",
         "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), *TINY]
    )
    sides = {(row["env"], row["algo"], row["side"]) for row in summary}
    assert ("simple_spread_v3", "ippo", "team") in sides and ("simple_spread_v3", "peer", "team") in sides
    assert ("simple_adversary_v3", "peer", "adversary") in sides and ("simple_adversary_v3", "ippo", "good agents") in sides
    for name in ("learning_curves.csv", "learning_summary.csv", "learning_simple_spread_v3.png",
                 "learning_simple_adversary_v3.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_profile_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    parts = load_benchmark("profile_ippo").main(["--timesteps", "200", "--n-envs", "8", "--top", "5"])
    assert parts["learn (total)"] > 0 and parts["update (train)"] <= parts["learn (total)"]
    assert "cumtime" in capsys.readouterr().out


def test_profile_group_update_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    ratios = load_benchmark("profile_ippo").main(["--group-update", "--agents", "2", "--rounds", "1", "--n-envs", "8"])
    assert set(ratios) == {2} and ratios[2] > 0
    assert "batched s" in capsys.readouterr().out


def test_games_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = ["--seeds", "1", "--ttt-timesteps", "80", "--c4-timesteps", "80", "--eval-every", "40", "--eval-games", "4"]
    rows = load_benchmark("games").main(
        [*options, "--final-games", "4", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path)]
    )
    # tictactoe: one run per learner seat; connect four: one self-play run evaluated in both seats.
    assert [(row["task"], row["eval_seat"]) for row in rows] == [
        ("tictactoe", "player_1"), ("tictactoe", "player_2"), ("connect_four", "player_0"), ("connect_four", "player_1"),
    ]  # fmt: skip
    assert all(row["games"] == 4 and row["env_steps"] >= 80 for row in rows)
    assert {path.name for path in tmp_path.iterdir()} >= {"games.csv", "games_curves.csv", "games.png"}
    assert "target" in capsys.readouterr().out


def test_cross_play_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache, algos = str(tmp_path / "cache"), ["ippo_shared_ppo", "peer"]
    load_benchmark("learning").main(
        ["--envs", "simple_adversary_v3", "--algos", *algos, "--timesteps", "200", "--seeds", "1", "--eval-episodes",
         "1", "--bins", "2", "--peer-batch-size", "50", "--out", str(tmp_path / "learning"), "--cache", cache, *TINY]
    )
    rows = load_benchmark("cross_play").main(
        ["--algos", *algos, "--seeds", "1", "--timesteps", "200", "--episodes", "2", "--peer-n-steps", "25",
         "--peer-batch-size", "50", "--own-pairs", "--cache", cache, "--out", str(tmp_path / "out")]
    )
    cells = {(row["mode"], row["good_side"], row["adversary"]): row for row in rows}
    modes = ("deterministic", "stochastic")
    assert set(cells) == {(mode, good, adversary) for mode in modes for good in algos for adversary in algos}
    # A model against itself plays as in its own evaluation (learning.py's, on the same episodes): the peer's
    # observations are padded as in training, and each side's rewards are summed.
    common = sys.modules["common"]
    kwargs = common.env_kwargs("simple_adversary_v3")
    saved = tmp_path / "cache" / "simple_adversary_v3_{}_seed0_200.zip"
    for algo, model, evaluate in (
        ("ippo_shared_ppo", IPPO.load(str(saved).format("ippo_shared_ppo")), common.evaluate_ippo),
        ("peer", PPO.load(str(saved).format("peer_n25_b50")), common.evaluate_peer),
    ):
        own = evaluate(model, "simple_adversary_v3", kwargs, 2, 20_000, deterministic=True)
        cell = cells["deterministic", algo, algo]
        assert cell["adversary_return"] == pytest.approx(own["return/adversary_0"])
        assert cell["good_return"] == pytest.approx(own["return/agent_0"] + own["return/agent_1"])
    assert "ippo_shared_ppo" in capsys.readouterr().out and (tmp_path / "out" / "cross_play.csv").stat().st_size > 0


def test_time_to_quality_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rates = tmp_path / "throughput.csv"
    rates.write_text("task,algo,env_steps_per_s\nsimple_spread_v3,ippo,300\nsimple_spread_v3,peer,100\n")
    rows = load_benchmark("time_to_quality").main(
        ["--smoke", "--tasks", "simple_spread_v3", "--algos", "ippo", "peer", "--out", str(tmp_path),
         "--ippo-timesteps", "400", "--rates", str(rates)]
    )
    assert {row["algo"] for row in rows} == {"ippo", "peer", "random"}
    for algo, episodes in (("ippo", 16), ("peer", 8)):  # 400 and 200 env steps of 25-step episodes
        with open(tmp_path / "runs" / f"simple_spread_v3_{algo}_seed0.csv") as file:
            header = file.readline().strip().split(",")
            assert header[:7] == ["algo", "task", "seed", "episode", "env_steps", "wall_seconds", "episode_return"]
            assert len(file.readlines()) == episodes
    by_algo = {row["algo"]: row for row in rows}
    assert by_algo["ippo"]["budget_env_steps"] == 200  # equal steps: read at the smallest budget
    # 3x the peer's rate: 600 env steps in the peer's time for 200, past IPPO's 400, so read at its end and marked.
    ippo = by_algo["ippo"]
    assert (ippo["rate_ratio"], ippo["env_steps_at_equal_time_rates"], ippo["short_of_rates"]) == (3.0, 600, True)
    with open(tmp_path / "runs" / "simple_spread_v3_ippo_seed0.csv") as file:
        last_tenth = [float(r["episode_return"]) for r in csv.DictReader(file) if 360 < int(r["env_steps"]) <= 400]
    assert ippo["equal_time_rates"] == pytest.approx(np.mean(last_tenth), abs=1e-3)
    assert by_algo["peer"]["rate_ratio"] == 1.0 and not by_algo["peer"]["short_of_rates"]
    table = capsys.readouterr().out
    assert "equal steps" in table and "equal time" in table and "n_steps 256/entry, batch 256" in table
    assert "eq. time (rates)" in table
    # --reuse reads the recorded runs back (from other processes, say) and trains nothing: the same figures.
    again = load_benchmark("time_to_quality").main(
        ["--smoke", "--tasks", "simple_spread_v3", "--algos", "ippo", "peer", "--out", str(tmp_path), "--reuse",
         "--rates", str(rates)]
    )
    assert "reused simple_spread_v3 ippo seed 0: 400 env steps" in capsys.readouterr().out
    for before, after in zip(rows, again, strict=True):
        for key in ("equal_env_steps", "equal_time", "equal_time_rates", "eval_deterministic", "train_seconds"):
            assert after[key] == pytest.approx(before[key], abs=1e-3), key
    assert (tmp_path / "time_to_quality_simple_spread_v3.png").stat().st_size > 0


def test_time_to_quality_peer_acts_in_each_agents_own_space() -> None:
    """The peer's padded action is mapped back as SuperSuit's pad_action_space_v0 does (the speaker has 3 of 5)."""
    ttq = load_benchmark("time_to_quality")
    learner = ttq.build("peer", "simple_speaker_listener_v4", 0, smoke=True)
    speaker_space = ttq.TASKS["simple_speaker_listener_v4"].make_env().action_space("speaker_0")
    observations = np.random.default_rng(0).normal(scale=30.0, size=(200, 3)).astype(np.float32)
    padded = [int(learner.model.predict(np.pad(obs, (0, 8)), deterministic=True)[0]) for obs in observations]
    assert max(padded) >= speaker_space.n  # the untrained network does pick padded actions
    assert all(speaker_space.contains(learner.act("speaker_0", obs)) for obs in observations)


def test_time_to_quality_throughput_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = load_benchmark("time_to_quality").main(
        ["--throughput", "--smoke", "--tasks", "simple_spread_v3", "--algos", "ippo", "peer", "--rounds", "1",
         "--throughput-steps", "50", "--out", str(tmp_path)]
    )
    assert {row["algo"] for row in rows} == {"ippo", "peer"} and all(row["env_steps_per_s"] > 0 for row in rows)
    assert "x peer" in capsys.readouterr().out


def test_time_to_quality_mappo_row_trains_and_acts_on_own_observations() -> None:
    ttq = load_benchmark("time_to_quality")
    learner = ttq.build("mappo", "simple_speaker_listener_v4", 0, smoke=True)
    learner.learn(400)  # 16 episodes of 25 steps on 2 copies: at least one update
    assert len(learner.episodes()) == 16 and learner.model.policy_version >= 1
    env = ttq.TASKS["simple_speaker_listener_v4"].make_env(max_cycles=25)
    obs, _ = env.reset(seed=0)
    assert all(env.action_space(agent).contains(learner.act(agent, obs[agent])) for agent in obs)


def test_time_to_quality_throughput_states_the_ratio_to_the_env_layer_alone(tmp_path: Path) -> None:
    rows = load_benchmark("time_to_quality").main(
        ["--smoke", "--throughput", "--tasks", "simple_spread_v3", "--algos", "ippo", "env", "--rounds", "1",
         "--throughput-steps", "200", "--out", str(tmp_path)]
    )
    by_algo = {row["algo"]: row for row in rows}
    assert by_algo["env"]["ratio_to_env"] == 1.0
    assert by_algo["ippo"]["ratio_to_env"] == pytest.approx(
        by_algo["ippo"]["env_steps_per_s"] / by_algo["env"]["env_steps_per_s"]
    )
    assert "x env" in (tmp_path / "throughput.txt").read_text()
