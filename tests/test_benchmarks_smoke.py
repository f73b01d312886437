"""The benchmark scripts run, at a tiny size."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch as th
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


def test_scaling_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    costs = load_benchmark("scaling").main(["--agents", "2", "3", "--rounds", "1", "--timesteps", "50", *TINY])
    assert set(costs) == {2, 3} and all(cost[name] > 0 for cost in costs.values() for name in ("ippo", "peer"))
    assert "IPPO/peer" in capsys.readouterr().out


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


def test_async_training_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--rounds", "1", "--timesteps", "800", "--n-envs", "2", "--vec-env", "dummy"]
    results = load_benchmark("async_training").main(args)
    medians = results["dummy"]
    assert medians["sync"] > 0 and medians["async"] > 0
    assert medians["ratio"] == pytest.approx(medians["async"] / medians["sync"])
    assert medians["ratio_steady"] == pytest.approx(medians["async_steady"] / medians["sync_steady"])
    assert "ratio async/sync" in capsys.readouterr().out


def test_group_update_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    ratios = load_benchmark("group_update").main(["--agents", "2", "--rounds", "1", "--n-envs", "8"])
    assert set(ratios) == {2} and ratios[2] > 0
    assert "batched s" in capsys.readouterr().out


def test_version_stamp_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    load_benchmark("version_stamp").main(["--stale-steps", "120", "--learn-steps", "0"])
    table = capsys.readouterr().out
    assert "episode_end" in table and "first_step" in table and "stale share" in table


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


def test_recompute_share_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    results = load_benchmark("recompute_share").main(
        ["--rounds", "2", "--trajectories", "4", "--steps", "8", "--n-epochs", "3", "--threads", "1"]
    )

    assert set(results) == {"target_kl=None", "target_kl=0.01"}
    assert results["target_kl=None"]["epochs"] == 3
    for medians in results.values():
        assert 0 < medians["recompute"] < medians["build_batch"] < medians["update"]
        assert 0 < medians["share"] < 1
    table = capsys.readouterr().out
    assert "target_kl=None" in table and "target_kl=0.01" in table and "share" in table


@pytest.mark.usefixtures("no_hang")
def test_soak_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    # A few seconds of training on failing env copies.
    summary = load_benchmark("soak").main(
        ["--minutes", "0.1", "--warmup-minutes", "0.01", "--report-seconds", "0.5", "--n-envs", "2",
         "--raise-prob", "0.01", "--exit-prob", "0.002", "--net-arch", "16", "--n-epochs", "2"]
    )
    assert summary["env_steps"] > 0 and summary["updates"] > 0
    assert summary["env_restarts"] > 0, "the injected failures were survived"
    assert summary["save_load_ok"]
    assert summary["baseline_mb"] > 0 and summary["final_mb"] > 0
    report = capsys.readouterr().out
    assert "rss_MB" in report and "restarts survived" in report and "resident memory after" in report


def test_recurrent_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--seeds", "1", "--timesteps", "200", "--eval-every", "100", "--eval-episodes", "1", "--rounds", "1"]
    load_benchmark("recurrent").main([*args, "--speed-steps", "100", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "ippo_lstm" in printed and "recurrent_ppo_supersuit" in printed
    assert (tmp_path / "speed.txt").exists() and (tmp_path / "learning_seeds0-0.txt").exists()


def test_time_to_quality_mappo_row_trains_and_acts_on_own_observations() -> None:
    ttq = load_benchmark("time_to_quality")
    learner = ttq.build("mappo", "simple_speaker_listener_v4", 0, smoke=True)
    learner.learn(400)  # 16 episodes of 25 steps on 2 copies: at least one update
    assert len(learner.episodes()) == 16 and learner.model.policy_version >= 1
    env = ttq.TASKS["simple_speaker_listener_v4"].make_env(max_cycles=25)
    obs, _ = env.reset(seed=0)
    assert all(env.action_space(agent).contains(learner.act(agent, obs[agent])) for agent in obs)


def test_mappo_vs_ippo_reads_windows_of_recorded_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for algo, offset in (("ippo", 0.0), ("mappo", 1.0)):
        lines = ["algo,task,seed,episode,env_steps,wall_seconds,episode_return"]
        lines += [f"{algo},simple_spread_v3,0,{i},{25 * (i + 1)},0.1,{-i + offset}" for i in range(40)]
        (runs / f"simple_spread_v3_{algo}_seed0.csv").write_text("\n".join(lines) + "\n")
    argv = [str(tmp_path), "--budget", "1000", "--points", "2", "--algos", "ippo", "mappo"]
    text = load_benchmark("mappo_vs_ippo").main(argv)
    # (900, 1000]: the episodes ending at 925, 950, 975, 1000 (i = 36..39): mean -37.5 for IPPO, -36.5 for MAPPO.
    assert "-37.50" in text and "-36.50" in text and "seeds: ippo 0; mappo 0" in text


def test_pursuit_gap_cuts_every_copy_on_sb3s_rollout_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    from sb3_ippo.buffer import AgentEpisodeBuffer

    # The script patches the buffer class in place: monkeypatch puts the original back afterwards.
    monkeypatch.setattr(AgentEpisodeBuffer, "add", AgentEpisodeBuffer.add)
    load_benchmark("pursuit_gap").sb3_rollout_cadence()
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=4)
    obs = np.zeros((1, 2), dtype=np.float32)
    # An episode of 6 steps, then 2 steps of the next: SB3 cuts at steps 4 and 8 of the copy, across the episode end.
    for step in range(1, 9):
        ended = np.array([step == 6])
        buffer.add(
            np.array([True]), obs, np.array([0]), np.ones(1), np.zeros(1), np.zeros(1), ended, np.array([False]), obs, {}, 0
        )

    assert [len(t) for t in buffer.finished] == [4, 2, 2]
    assert [t.terminated for t in buffer.finished] == [False, True, False]
    assert buffer.finished[2].bootstrap_obs is not None


def test_pursuit_gap_normalizes_advantages_per_minibatch(monkeypatch: pytest.MonkeyPatch) -> None:
    from sb3_ippo.update import ppo as ppo_module

    seen: list[th.Tensor] = []
    monkeypatch.setattr(ppo_module, "_losses", lambda policy, batch, advantages, *clip: seen.append(advantages))
    load_benchmark("pursuit_gap").per_minibatch_advantages()
    ppo_module._losses(None, None, th.tensor([1.0, 2.0, 3.0]), 0.2, None)

    np.testing.assert_allclose(seen[0].numpy(), [-1.0, 0.0, 1.0], atol=1e-6)


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
