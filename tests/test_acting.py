"""One way to act (DESIGN.md): every path that acts with a model outside ``learn`` (evaluation, the eval callback, the
command line, games, frozen opponents and self-play snapshots) carries each agent's recurrent state as collection does:
from that agent's own first step, reset at its episode end, zeros for an agent that joins mid-episode.

The policies here are hand-set LSTMs whose actions depend on their memory alone:

- a *step counter* (on :class:`DyingAgentsEnv`): it plays 0 at the first step it acts and 1 after, so a late joiner
  whose LSTM ran while it was absent plays wrongly at its first step;
- a *cue memory* (on :class:`CueMemoryEnv`): it answers the cue it saw at the episode's first step, and answers 0 when it
  has no memory of it, so a player without its state is right half the time.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.vec_env import VecEnvWrapper

from sb3_ippo import IPPO, MultiAgentEvalCallback, evaluate_policy, make_vec_env
from sb3_ippo.common.acting import CarryingModel, acting_model
from sb3_ippo.cli import main
from sb3_ippo.common.evaluation import evaluate_agents
from sb3_ippo.games.evaluation import evaluate_game
from sb3_ippo.games.self_play import ModelOpponent
from tests.envs import CueMemoryEnv, DyingAgentsEnv

# One LSTM unit, straight to the action logits: every policy here is set by hand.
HAND_SET: dict[str, Any] = dict(lstm_hidden_size=1, net_arch=dict(pi=[], vf=[]))


def frozen(_progress_remaining: float) -> float:
    """A learning rate of 0: an update (if any) leaves the hand-set weights as they are."""
    return 0.0


def set_lstm(
    model: IPPO, weight_ih: list[list[float]], bias_ih: list[float], action_weight: float, action_bias: float
) -> IPPO:
    """Every agent's actor LSTM (gates i, f, g, o; no recurrent weights) and action head (logits ``[0, w * h + b]``)."""
    for policy in model.policies.values():
        lstm, head = policy.lstm_actor, policy.action_net  # type: ignore[attr-defined]
        with th.no_grad():
            lstm.weight_ih_l0.copy_(th.tensor(weight_ih))
            lstm.bias_ih_l0.copy_(th.tensor(bias_ih))
            lstm.weight_hh_l0.zero_()
            lstm.bias_hh_l0.zero_()
            head.weight.copy_(th.tensor([[0.0], [action_weight]]))
            head.bias.copy_(th.tensor([0.0, action_bias]))
    return model


def late_joiner() -> DyingAgentsEnv:
    """agent_1 joins after step 3 of 6: it acts at steps 3, 4 and 5."""
    return DyingAgentsEnv(death_steps={"agent_0": None, "agent_1": None}, join_steps={"agent_1": 3})


def hand_set_model(env: Any, **kwargs: Any) -> IPPO:
    """An LSTM model whose weights never change (no update within these tests' budgets, and a learning rate of 0)."""
    params: dict[str, Any] = dict(
        n_episodes=1000, learning_rate=frozen, policy_kwargs=HAND_SET, seed=0, async_training=False, batched=False
    )
    return IPPO("MlpLstmPolicy", env, **{**params, **kwargs})


def step_counter(env: Any = None) -> IPPO:
    """Plays 0 at the first step it acts and 1 after: c counts its steps (input, forget, cell and output gates open
    whatever it sees), h = tanh(c) is 0.76 after one step and 0.96 after two, and it plays 1 where h > 0.9.

    On :func:`late_joiner` (target ``(t + agent index) % 2``), each agent's state carried from its own first step scores
    4 (agent_0: 1, 1, 0, 1, 0, 1) + 2 (agent_1 at steps 3-5: 1, 1, 0) = 6 per episode. A late joiner whose LSTM ran over
    the steps before it joined plays 1 at once and scores 1: 5 per episode."""
    model = hand_set_model(env if env is not None else late_joiner())
    return set_lstm(model, [[0.0, 0.0]] * 4, [10.0] * 4, action_weight=200.0, action_bias=-180.0)


CARRIED_RETURN = 6.0


def cue_memory(env: Any = None, **kwargs: Any) -> IPPO:
    """Answers the cue of CueMemoryEnv (observation ``[cue == 0, cue == 1, asked]``): the input gate opens only where
    a cue is shown, the cell takes +1 for cue 1 and -1 for cue 0 and keeps it (forget gate open); it plays 1 where h > 0.
    With no memory of the cue, h = 0 and it answers 0 (deterministic)."""
    model = hand_set_model(env if env is not None else CueMemoryEnv(delay=3), **kwargs)
    weight_ih = [[10.0, 10.0, 0.0], [0.0, 0.0, 0.0], [-10.0, 10.0, 0.0], [0.0, 0.0, 0.0]]
    return set_lstm(model, weight_ih, [-5.0, 10.0, 0.0, 10.0], action_weight=20.0, action_bias=0.0)


def cue_games(n_envs: int = 2, seed: int = 0) -> Any:
    """CueMemoryEnv as a game: a seat wins when it answers its cue and the other does not."""
    return make_vec_env(lambda: CueMemoryEnv(delay=3), n_envs=n_envs, seed=seed)


# ----------------------------------------------------------------------------------------------------------------
# A late joiner starts from zeros: evaluate_policy, the eval callback, the command line
# ----------------------------------------------------------------------------------------------------------------


def test_evaluate_policy_starts_a_late_joiner_from_zeros() -> None:
    env = make_vec_env(late_joiner, n_envs=2, seed=0)
    returns, lengths = evaluate_policy(step_counter(), env, n_eval_episodes=4, return_episode_rewards=True)
    assert list(returns) == [CARRIED_RETURN] * 4 and list(lengths) == [6] * 4  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:IPPO.learn ended")
def test_collection_scores_what_evaluation_scores() -> None:
    # Collection samples its actions, from logits that leave no doubt (-28 at the first step, +13 after).
    model = step_counter(make_vec_env(late_joiner, n_envs=2, seed=0))
    model.learn(48)
    assert [episode["r"] for episode in model.ep_info_buffer] == [CARRIED_RETURN] * 8


@pytest.mark.filterwarnings("ignore:IPPO.learn ended")
def test_the_eval_callback_starts_a_late_joiner_from_zeros() -> None:
    model = step_counter(make_vec_env(late_joiner, n_envs=2, seed=0))
    callback = MultiAgentEvalCallback(make_vec_env(late_joiner, n_envs=2, seed=1), n_eval_episodes=2, eval_freq=1, verbose=0)
    model.learn(2, callback=callback)
    assert callback.last_mean_reward == CARRIED_RETURN


class PassThrough(VecEnvWrapper):
    """An SB3 ``VecEnvWrapper`` that changes nothing, around the env as ``VecVideoRecorder`` is (``evaluate --video``)."""

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        return self.venv.step_wait()


def test_evaluate_agents_starts_a_late_joiner_from_zeros_inside_a_vec_env_wrapper() -> None:
    result = evaluate_agents(step_counter(), PassThrough(make_vec_env(late_joiner, n_envs=2, seed=0)), n_eval_episodes=2)
    assert result.team_returns == [CARRIED_RETURN] * 2
    assert result.agent_returns == {"agent_0": [4.0, 4.0], "agent_1": [2.0, 2.0]}


def test_the_command_lines_evaluate_starts_a_late_joiner_from_zeros(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "late_joiner_env.py").write_text(
        "from tests.envs import DyingAgentsEnv\n\n\n"
        "def parallel_env():\n"
        "    return DyingAgentsEnv(death_steps={'agent_0': None, 'agent_1': None}, join_steps={'agent_1': 3})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "late_joiner_env", raising=False)
    step_counter().save(tmp_path / "model.zip")
    capsys.readouterr()
    main(["evaluate", str(tmp_path / "model.zip"), "--env", "late_joiner_env", "--episodes", "2"])
    team_return = next(line for line in capsys.readouterr().out.splitlines() if "team return" in line)
    assert team_return.split()[2] == "6.00", team_return


# ----------------------------------------------------------------------------------------------------------------
# Memory against an opponent: games, the callback with an opponent, model opponents
# ----------------------------------------------------------------------------------------------------------------


def test_evaluation_against_an_opponent_carries_the_models_state() -> None:
    # The model always answers its cue, the random opponent half the time: the model never loses.
    records = evaluate_policy(cue_memory(), cue_games(), n_eval_episodes=40, opponent="random")
    assert isinstance(records, dict)
    assert all(record.loss_rate == 0.0 and record.n_games == 40 for record in records.values()), records


@pytest.mark.filterwarnings("ignore:IPPO.learn ended")
def test_the_eval_callback_with_an_opponent_carries_the_models_state(tmp_path: pathlib.Path) -> None:
    model = cue_memory(cue_games())
    callback = MultiAgentEvalCallback(
        cue_games(seed=1), n_eval_episodes=40, eval_freq=1, opponent="random", log_path=str(tmp_path), verbose=0
    )
    model.learn(2, callback=callback)
    assert callback.evaluations_loss_rates == [[0.0, 0.0]]


def test_a_recurrent_model_opponent_carries_its_state() -> None:
    # The model and its opponent both always answer their cues: every game is a draw.
    model = cue_memory()
    records = evaluate_game(model, cue_games(), ModelOpponent(model, deterministic=True), n_eval_episodes=20)
    assert all(record.draw_rate == 1.0 for record in records.values()), records


# ----------------------------------------------------------------------------------------------------------------
# Frozen seats during collection: a fixed recurrent opponent, self-play snapshots
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:IPPO.learn ended")
@pytest.mark.parametrize(
    "frozen_seats",
    [
        pytest.param(lambda: dict(opponents={"agent_1": cue_memory()}), id="fixed-opponent"),
        pytest.param(lambda: dict(self_play_pool=dict(snapshot_every=1, size=1)), id="self-play-snapshot"),
    ],
)
def test_frozen_recurrent_players_carry_their_state_during_collection(frozen_seats: Any) -> None:
    # Every player, the learner (sampling from near-certain logits) and the frozen one alike, answers its cue.
    model = cue_memory(cue_games(), **frozen_seats())
    model.learn(96)
    episodes = list(model.ep_info_buffer)
    assert model._seats is not None and len(episodes) >= 20
    assert all(episode["agent_returns"] == {"agent_0": 1.0, "agent_1": 1.0} for episode in episodes), episodes


# ----------------------------------------------------------------------------------------------------------------
# predict's episode_start per agent
# ----------------------------------------------------------------------------------------------------------------


def test_an_episode_start_dict_without_a_recurrent_agent_is_a_clear_error() -> None:
    model = step_counter()
    obs = {agent: np.zeros((2, 2), np.float32) for agent in model.possible_agents}
    with pytest.raises(ValueError, match=r"episode_start has no entry for agent 'agent_1', whose policy is recurrent"):
        model.predict(obs, episode_start={"agent_0": np.ones(2, dtype=bool)})
    # Only the agents observed need one.
    actions, _ = model.predict({"agent_0": obs["agent_0"]}, episode_start={"agent_0": np.ones(2, dtype=bool)})
    assert set(actions) == {"agent_0"}


# ----------------------------------------------------------------------------------------------------------------
# Feed-forward models act as they always did
# ----------------------------------------------------------------------------------------------------------------


def test_a_model_without_recurrent_agents_is_evaluated_by_sb3s_loop_itself() -> None:
    env = make_vec_env(late_joiner, n_envs=2, seed=0)
    model = IPPO("MlpPolicy", env, policy_kwargs=dict(net_arch=[8]), seed=0)
    assert acting_model(model, env) is model
    assert isinstance(acting_model(step_counter(), env), CarryingModel)
