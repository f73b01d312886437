"""SB3's callback contract, and SB3's own callbacks, unchanged on IPPO (mirrors SB3's test_callbacks.py).

Most tests train on two copies of :class:`DyingAgentsEnv`: three agents leave at steps 2, 4 and 6, so every copy's
episode lasts 6 steps, its team return is at most 2 + 4 + 6 = 12, and one vectorized step adds 2 timesteps.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    CheckpointCallback,
    EveryNTimesteps,
    LogEveryNTimesteps,
    ProgressBarCallback,
    StopTrainingOnMaxEpisodes,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.logger import Logger

from sb3_ippo import IPPO, MultiAgentEvalCallback, evaluate_policy, make_vec_env
from tests.envs import DyingAgentsEnv
from tests.helpers import ALGORITHMS, RecordingOutput, make_algo_vec_env
from tests.helpers import make_model as make_algo_model

N_ENVS = 2
EPISODE_LENGTH = 6
BEST_TEAM_RETURN = 2 + 4 + 6


def make_model(n_envs: int = N_ENVS, algo: type[IPPO] = IPPO, **kwargs: Any) -> IPPO:
    params: dict[str, Any] = dict(n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    params.update(kwargs)
    return make_algo_model(make_algo_vec_env(algo, DyingAgentsEnv, n_envs=n_envs, seed=0), algo, **params)


@pytest.fixture(params=ALGORITHMS, ids=lambda algo: algo.__name__)
def algo(request: pytest.FixtureRequest) -> type[IPPO]:
    """IPPO, and MAPPO, which shares its contract (with the joint observation as its critic's input)."""
    return request.param


class Recorder(BaseCallback):
    """Records every hook call, the timesteps and ``locals`` at each step; stops training after ``stop_after`` steps."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.stop_after = stop_after
        self.events: list[str] = []
        self.step_timesteps: list[int] = []
        self.step_locals: list[dict[str, Any]] = []

    def _on_training_start(self) -> None:
        self.events.append("training_start")

    def _on_rollout_start(self) -> None:
        self.events.append("rollout_start")

    def _on_step(self) -> bool:
        self.events.append("step")
        self.step_timesteps.append(self.num_timesteps)
        self.step_locals.append(
            {
                "new_obs": {agent: np.array(obs) for agent, obs in self.locals["new_obs"].items()},
                "rewards": np.array(self.locals["rewards"]),
                "dones": np.array(self.locals["dones"]),
                "infos": list(self.locals["infos"]),
            }
        )
        return self.stop_after is None or self.n_calls < self.stop_after

    def _on_rollout_end(self) -> None:
        self.events.append("rollout_end")

    def _on_training_end(self) -> None:
        self.events.append("training_end")


@pytest.fixture(scope="module")
def recorded() -> tuple[IPPO, Recorder]:
    """A model trained for 48 timesteps (4 episodes per copy) with a :class:`Recorder`."""
    model = make_model()
    recorder = Recorder()
    model.learn(48, callback=recorder)
    return model, recorder


def test_on_step_is_called_once_per_vectorized_step(recorded: tuple[IPPO, Recorder]) -> None:
    model, recorder = recorded
    assert model.num_timesteps == 48
    assert recorder.step_timesteps == list(range(N_ENVS, 48 + 1, N_ENVS))


def test_hooks_are_called_in_sb3_order(recorded: tuple[IPPO, Recorder]) -> None:
    model, recorder = recorded
    events = [event for event in recorder.events if event != "step"]
    assert events[0] == "training_start" and events[-1] == "training_end"
    rollouts = events[1:-1]
    assert rollouts == ["rollout_start", "rollout_end"] * (len(rollouts) // 2)
    # One rollout per update.
    assert len(rollouts) // 2 == model.policy_version >= 2


def test_hooks_frame_every_step(recorded: tuple[IPPO, Recorder]) -> None:
    _, recorder = recorded
    assert recorder.events[:2] == ["training_start", "rollout_start"]
    assert recorder.events[-2:] == ["rollout_end", "training_end"]
    inside_rollout = False
    for event in recorder.events:
        if event in ("rollout_start", "rollout_end"):
            inside_rollout = event == "rollout_start"
        elif event == "step":
            assert inside_rollout


def test_locals_new_obs_is_a_dict_of_per_agent_arrays(recorded: tuple[IPPO, Recorder]) -> None:
    model, recorder = recorded
    for step in recorder.step_locals:
        assert list(step["new_obs"]) == model.possible_agents
        for agent, obs in step["new_obs"].items():
            assert obs.shape == (N_ENVS, *model.observation_spaces[agent].shape)


def test_locals_dones_are_one_bool_per_copy_at_each_episode_end(recorded: tuple[IPPO, Recorder]) -> None:
    _, recorder = recorded
    for index, step in enumerate(recorder.step_locals, start=1):
        assert step["dones"].dtype == bool and step["dones"].shape == (N_ENVS,)
        assert step["dones"].tolist() == [index % EPISODE_LENGTH == 0] * N_ENVS


def test_locals_infos_are_one_dict_per_copy_with_the_episode_at_its_end(recorded: tuple[IPPO, Recorder]) -> None:
    _, recorder = recorded
    for step in recorder.step_locals:
        assert isinstance(step["infos"], list) and len(step["infos"]) == N_ENVS
        assert all(isinstance(info, dict) for info in step["infos"])
        assert ["episode" in info for info in step["infos"]] == step["dones"].tolist()


def test_locals_rewards_are_each_copys_team_reward(recorded: tuple[IPPO, Recorder]) -> None:
    _, recorder = recorded
    team_returns = np.zeros(N_ENVS)
    n_episodes = 0
    for step in recorder.step_locals:
        assert step["rewards"].shape == (N_ENVS,)
        team_returns += step["rewards"]
        for env_idx in np.flatnonzero(step["dones"]):
            assert team_returns[env_idx] == pytest.approx(step["infos"][env_idx]["episode"]["r"])
            team_returns[env_idx] = 0.0
            n_episodes += 1
    assert n_episodes == 4 * N_ENVS


def test_a_callback_returning_false_stops_training(algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    recorder = Recorder(stop_after=5)
    model.learn(1000, callback=recorder)
    assert recorder.n_calls == 5
    assert model.num_timesteps == 5 * N_ENVS
    assert recorder.events[-1] == "training_end"


def test_checkpoint_callback_saves_loadable_models(tmp_path: pathlib.Path, algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    model.learn(36, callback=CheckpointCallback(save_freq=6, save_path=str(tmp_path), name_prefix="ippo"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ippo_12_steps.zip", "ippo_24_steps.zip", "ippo_36_steps.zip"]
    checkpoint = algo.load(tmp_path / "ippo_24_steps.zip")
    assert checkpoint.num_timesteps == 24
    assert checkpoint.possible_agents == model.possible_agents


def test_progress_bar_counts_every_timestep() -> None:
    model = make_model()
    progress_bar = ProgressBarCallback()
    model.learn(30, callback=progress_bar)
    assert progress_bar.pbar.total == 30
    assert progress_bar.pbar.n == model.num_timesteps == 30


def test_learn_with_progress_bar() -> None:
    model = make_model()
    assert model.learn(30, progress_bar=True) is model
    assert model.num_timesteps == 30


def test_callback_list_calls_every_callback() -> None:
    model = make_model()
    first, second = Recorder(), Recorder()
    model.learn(24, callback=CallbackList([first, second]))
    assert first.step_timesteps == second.step_timesteps == list(range(N_ENVS, 24 + 1, N_ENVS))
    assert first.events == second.events


def test_a_list_of_callbacks_is_a_callback_list() -> None:
    model = make_model()
    first, second = Recorder(), Recorder(stop_after=3)
    model.learn(1000, callback=[first, second])
    assert first.n_calls == second.n_calls == 3


def test_every_n_timesteps_triggers_its_callback_every_n_timesteps(algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    triggered = Recorder()
    model.learn(40, callback=EveryNTimesteps(n_steps=10, callback=triggered))
    assert triggered.step_timesteps == [10, 20, 30, 40]


def test_stop_training_on_max_episodes_counts_the_episodes_of_every_copy(algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    model.learn(1000, callback=StopTrainingOnMaxEpisodes(max_episodes=3))
    # SB3's convention: max_episodes per copy.
    assert model.num_timesteps == 3 * EPISODE_LENGTH * N_ENVS


def test_log_every_n_timesteps_dumps_the_logs() -> None:
    model = make_model()
    output = RecordingOutput()
    model.set_logger(Logger(folder=None, output_formats=[output]))
    model.learn(36, callback=LogEveryNTimesteps(n_steps=12), log_interval=10**9)
    assert [dump["time/total_timesteps"] for dump in output.dumps] == [12, 24, 36]


# ----------------------------------------------------------------------------------------------------------------
# Evaluation: SB3's evaluation loop on the multi-agent vectorized env
# ----------------------------------------------------------------------------------------------------------------


class OracleModel:
    """Answers DyingAgentsEnv's observations ``[t / max_steps, target]`` with the rewarded action (1 per agent step)."""

    def predict(
        self, observation: dict[str, np.ndarray], state: Any = None, episode_start: Any = None, deterministic: bool = False
    ):
        return {agent: obs[..., 1].astype(np.int64) for agent, obs in observation.items()}, None


def test_evaluate_policy_scores_the_team_return() -> None:
    mean, std = evaluate_policy(OracleModel(), DyingAgentsEnv(), n_eval_episodes=3)
    assert (mean, std) == (BEST_TEAM_RETURN, 0.0)


def test_evaluate_policy_returns_each_episodes_team_return_and_length() -> None:
    env = make_vec_env(DyingAgentsEnv, n_envs=2)
    returns, lengths = evaluate_policy(OracleModel(), env, n_eval_episodes=5, return_episode_rewards=True)
    assert list(returns) == [BEST_TEAM_RETURN] * 5
    assert list(lengths) == [EPISODE_LENGTH] * 5


def test_evaluate_policy_runs_an_ippo_model(algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    returns, lengths = evaluate_policy(model, DyingAgentsEnv(), n_eval_episodes=4, return_episode_rewards=True)
    assert len(returns) == len(lengths) == 4
    assert all(0 <= team_return <= BEST_TEAM_RETURN for team_return in returns)
    mean, std = evaluate_policy(model, DyingAgentsEnv(), n_eval_episodes=4)
    assert mean == pytest.approx(np.mean(returns)) and std == pytest.approx(np.std(returns))


def test_evaluate_policy_leaves_the_observation_statistics_frozen(algo: type[IPPO]) -> None:
    model = make_model(algo=algo, normalize_obs=True)
    model.learn(12)
    assert model.obs_normalizers is not None

    def counts() -> dict[str, Any]:  # MAPPO keeps statistics of the own observation and of the critic input
        assert model.obs_normalizers is not None
        return {
            agent: {key: rms.count for key, rms in rms_of.items()} if isinstance(rms_of, dict) else rms_of.count  # type: ignore[union-attr]
            for agent, rms_of in ((agent, normalizer.obs_rms) for agent, normalizer in model.obs_normalizers.items())
        }

    before = counts()
    evaluate_policy(model, DyingAgentsEnv(), n_eval_episodes=2)
    assert counts() == before


def test_eval_callback_saves_the_best_model_and_the_evaluations(tmp_path: pathlib.Path, algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    output = RecordingOutput()
    model.set_logger(Logger(folder=None, output_formats=[output]))
    eval_callback = MultiAgentEvalCallback(
        DyingAgentsEnv(), n_eval_episodes=2, eval_freq=6, best_model_save_path=str(tmp_path), log_path=str(tmp_path), verbose=0
    )
    model.learn(24, callback=eval_callback)
    evaluations = np.load(tmp_path / "evaluations.npz")
    assert list(evaluations["timesteps"]) == [12, 24]
    assert evaluations["results"].shape == (2, 2)
    assert eval_callback.best_mean_reward == pytest.approx(evaluations["results"].mean(axis=1).max())
    assert algo.load(tmp_path / "best_model.zip").possible_agents == model.possible_agents
    assert any("eval/mean_reward" in dump for dump in output.dumps)


@pytest.mark.parametrize(("reward_threshold", "expected_timesteps"), [(-1.0, 6 * N_ENVS), (BEST_TEAM_RETURN + 1, 36)])
def test_eval_callback_with_stop_training_on_reward_threshold(
    reward_threshold: float, expected_timesteps: int, algo: type[IPPO]
) -> None:
    model = make_model(algo=algo)
    stop = StopTrainingOnRewardThreshold(reward_threshold=reward_threshold, verbose=0)
    eval_callback = MultiAgentEvalCallback(
        DyingAgentsEnv(), callback_on_new_best=stop, n_eval_episodes=2, eval_freq=6, verbose=0
    )
    model.learn(36, callback=eval_callback)
    # A team return of at least 0 reaches -1 at the first evaluation; BEST_TEAM_RETURN + 1 is never reached.
    assert model.num_timesteps == expected_timesteps
