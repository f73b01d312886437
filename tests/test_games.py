"""Turn-based games: AEC copies stepped turn by turn, action masks, frozen opponents, self-play and game evaluation."""

from __future__ import annotations

import pathlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.classic import connect_four_v3, tictactoe_v3
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.callbacks import BaseCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.utils import obs_as_tensor

from sb3_ippo import IPPO, MultiAgentEvalCallback, evaluate_policy, make_vec_env
from sb3_ippo.common.buffer import Trajectory
from sb3_ippo.games.evaluation import SeatRecord, outcome
from sb3_ippo.games.masking import MaskedInputMixin
from sb3_ippo.ippo.ippo import default_update_settings
from sb3_ippo.update.batch import build_batch
from sb3_ippo.games.self_play import RandomOpponent
from tests.helpers import P1, P2, stacked_groups, tictactoe

# Most tests collect a few moves on purpose, without an update; the old-API deprecation is PettingZoo's (module imports).
pytestmark = [
    pytest.mark.filterwarnings("ignore:IPPO.learn ended after .* without a single update:UserWarning"),
    pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning"),
]

TINY: dict[str, Any] = dict(policy_kwargs=dict(net_arch=[16]), n_epochs=2, seed=0)


class ScriptedMoves:
    """Replaces ``IPPO._act``: plays the moves of a hand-played script, whoever is to move, with value 0 and
    log-prob 0 (the bookkeeping under test does not look at them)."""

    def __init__(self, moves: Sequence[int]) -> None:
        self.moves = iter(moves)

    def __call__(self, obs: Any, alive: dict[str, np.ndarray], acting: list[str]) -> dict[str, tuple]:
        if not acting:
            return {}  # a frozen opponent's turn
        assert len(acting) == 1, f"one agent moves at a time in one copy, got {acting}"
        return {acting[0]: (np.array([next(self.moves)]), np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.float32))}


def played(moves: Sequence[int], **ippo_kwargs: Any) -> IPPO:
    """A model that collected exactly ``moves`` (hand-played, one copy), with no update in between."""
    model = IPPO("MlpPolicy", tictactoe(), n_episodes=100, **{**TINY, **ippo_kwargs})
    model._act = ScriptedMoves(moves)  # type: ignore[method-assign]
    model.learn(len(moves))
    return model


def finished(model: IPPO, agent: str) -> list[Trajectory]:
    return list(model.buffers[agent].finished)


def board(trajectory: Trajectory, step: int) -> np.ndarray:
    """The board an observation shows: 1 for the agent's own marks, 2 for the opponent's, by cell 0..8."""
    planes = trajectory.observations["observation"][step]  # type: ignore[index]
    return (planes[..., 0] + 2 * planes[..., 1]).reshape(-1)


# ----------------------------------------------------------------------------------------------------------------
# Turn-based copies: transitions from a turn to the next, rewards as last() reports them
# ----------------------------------------------------------------------------------------------------------------


def test_a_hand_played_win_gives_each_seat_its_moves_and_their_rewards() -> None:
    # X (player_1) plays cells 0, 1, 2 (a line); O (player_2) plays 3, 4. X's third move wins.
    model = played([0, 3, 1, 4, 2])
    (x,), (o,) = finished(model, P1), finished(model, P2)
    assert x.actions.tolist() == [0, 1, 2] and x.rewards.tolist() == [0.0, 0.0, 1.0] and x.terminated
    # The loser's last move came before the winning one: the end and the -1 still reach that move.
    assert o.actions.tolist() == [3, 4] and o.rewards.tolist() == [0.0, -1.0] and o.terminated
    # Each seat's observations are the boards at its own turns (own marks 1, the opponent's 2).
    assert board(x, 0).tolist() == [0] * 9
    assert board(x, 2).tolist() == [1, 1, 0, 2, 2, 0, 0, 0, 0]
    assert board(o, 0).tolist() == [2, 0, 0, 0, 0, 0, 0, 0, 0]
    assert board(o, 1).tolist() == [2, 2, 0, 1, 0, 0, 0, 0, 0]
    # Masks travel with the observations: the legal moves at each turn.
    assert x.observations["action_mask"][2].tolist() == [0, 0, 1, 0, 0, 1, 1, 1, 1]  # type: ignore[index]
    (episode,) = model.ep_info_buffer
    assert episode["l"] == 5 and episode["r"] == 0.0 and episode["agent_returns"] == {P1: 1.0, P2: -1.0}


def test_the_opponents_winning_reply_is_the_reward_of_the_losers_last_move() -> None:
    # O wins with 3, 4, 5: X's last move (8) is the one that lost, one turn before O's winning move.
    model = played([0, 3, 1, 4, 8, 5])
    (x,), (o,) = finished(model, P1), finished(model, P2)
    assert x.actions.tolist() == [0, 1, 8] and x.rewards.tolist() == [0.0, 0.0, -1.0] and x.terminated
    assert o.actions.tolist() == [3, 4, 5] and o.rewards.tolist() == [0.0, 0.0, 1.0] and o.terminated


def test_a_draw_ends_both_seats_with_zero() -> None:
    # A full board without a line: X 0, 2, 5, 6, 7; O 1, 3, 4, 8.
    model = played([0, 1, 2, 3, 5, 4, 6, 8, 7])
    (x,), (o,) = finished(model, P1), finished(model, P2)
    assert x.actions.tolist() == [0, 2, 5, 6, 7] and x.rewards.tolist() == [0.0] * 5 and x.terminated
    assert o.actions.tolist() == [1, 3, 4, 8] and o.rewards.tolist() == [0.0] * 4 and o.terminated
    assert model.ep_info_buffer[0]["agent_returns"] == {P1: 0.0, P2: 0.0}


def test_consecutive_games_in_one_copy_start_new_trajectories() -> None:
    model = played([*[0, 3, 1, 4, 2], *[0, 3, 1, 4, 8, 5]])
    assert [t.rewards.tolist() for t in finished(model, P1)] == [[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]]
    assert [t.rewards.tolist() for t in finished(model, P2)] == [[0.0, -1.0], [0.0, 0.0, 1.0]]
    assert [info["l"] for info in model.ep_info_buffer] == [5, 6]


def test_a_time_limit_truncates_both_seats_and_each_bootstraps_from_its_own_view() -> None:
    model = played([0, 3, 1], max_episode_steps=3)
    (x,), (o,) = finished(model, P1), finished(model, P2)
    assert x.actions.tolist() == [0, 1] and not x.terminated
    assert o.actions.tolist() == [3] and not o.terminated
    # The bootstrap observations show the board after the third move, from each seat's side.
    assert (x.bootstrap_obs["observation"][..., 0] + 2 * x.bootstrap_obs["observation"][..., 1]).reshape(-1).tolist() == [
        1, 1, 0, 2, 0, 0, 0, 0, 0,
    ]  # fmt: skip
    assert (o.bootstrap_obs["observation"][..., 0] + 2 * o.bootstrap_obs["observation"][..., 1]).reshape(-1).tolist() == [
        2, 2, 0, 1, 0, 0, 0, 0, 0,
    ]  # fmt: skip


def test_alive_marks_the_agent_to_move_in_each_copy() -> None:
    env = tictactoe(n_envs=2)
    env.reset()
    assert env.alive[P1].tolist() == [True, True] and env.alive[P2].tolist() == [False, False]
    step = env.step_agents({P1: np.array([0, 4]), P2: np.array([8, 8])})  # player_2's rows are ignored
    assert step.alive[P1].tolist() == [False, False] and step.alive[P2].tolist() == [True, True]
    assert step.obs[P2]["action_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert step.obs[P2]["action_mask"][1].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1]


def test_an_illegal_move_never_reaches_the_env() -> None:
    env = tictactoe(n_envs=2)
    env.reset()
    env.step_agents({P1: np.array([0, 0])})
    boards_before = [list(copy.unwrapped.board.squares) for copy in env.envs]
    # Copy 0's player_2 tries the taken cell 0; copy 1's move is legal, but no copy steps.
    with pytest.raises(ValueError, match=r"agent 'player_2' chose action 0, which its action_mask forbids"):
        env.step_agents({P2: np.array([0, 5])})
    assert [list(copy.unwrapped.board.squares) for copy in env.envs] == boards_before
    assert [copy.agent_selection for copy in env.envs] == [P2, P2]


class CrashOnce:
    """A tictactoe factory whose first env raises at its third move (an env bug), the others never."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> Any:
        env = tictactoe_v3.env()
        self.made += 1
        if self.made == 1:
            step, moves = env.step, []

            def crashing_step(action: Any) -> None:
                moves.append(action)
                if len(moves) == 3:
                    raise RuntimeError("the board caught fire")
                step(action)

            env.step = crashing_step  # type: ignore[method-assign]
        return env


def test_a_failing_game_copy_is_restarted_and_only_its_game_is_lost() -> None:
    factory = CrashOnce()
    env = make_vec_env(factory, n_envs=1, seed=0, on_env_error="restart")
    model = IPPO("MlpPolicy", env, n_episodes=100, **TINY)
    model.learn(20)
    assert env.restarts == 1 and factory.made == 2  # the copy that failed (make_vec_env's probe), its replacement
    assert model.episodes_lost == 2  # the game in progress: each seat's open trajectory, never trained on
    # After the restart, games go on and finish normally.
    assert len(model.ep_info_buffer) >= 1 and all(len(t) >= 3 for t in finished(model, P1))


def test_an_illegal_move_is_an_error_even_with_restarts() -> None:
    env = make_vec_env(tictactoe_v3.env, n_envs=1, seed=0, on_env_error="restart")
    env.reset()
    env.step_agents({P1: np.array([4])})
    with pytest.raises(ValueError, match="Illegal move refused"):
        env.step_agents({P2: np.array([4])})
    assert env.restarts == 0


def test_rollout_len_never_cuts_a_game_and_updates_on_whole_games_covering_its_transitions() -> None:
    # A move's reward arrives with the other player's reply: a cut would lose it. So in a turn-based env rollout_len
    # (the default rule) takes whole games covering rollout_len * n_envs transitions per agent.
    model = IPPO("MlpPolicy", tictactoe(), rollout_len=4, **TINY)
    drained: list[list[Any]] = []
    for buffer in model.buffers.values():
        drain = buffer.drain

        def recording_drain(*args: Any, _drain: Any = drain) -> list[Any]:
            trajectories = _drain(*args)
            drained.append(trajectories)
            return trajectories

        buffer.drain = recording_drain  # type: ignore[method-assign]
    model.learn(60)
    assert model.policy_version >= 2
    assert drained and all(batch for batch in drained)
    for batch in drained:
        assert all(trajectory.terminated or trajectory.truncated for trajectory in batch)  # whole games only
        assert sum(len(trajectory) for trajectory in batch) >= 4  # rollout_len * n_envs (1 copy) transitions


# ----------------------------------------------------------------------------------------------------------------
# Action masks
# ----------------------------------------------------------------------------------------------------------------


def random_masks(rng: np.random.Generator, rows: int, n: int, forbidden: int | None = None) -> np.ndarray:
    """Masks with at least one legal move each (never ``forbidden``)."""
    masks = (rng.random((rows, n)) < rng.uniform(0.1, 0.6, size=(rows, 1))).astype(np.int8)
    allowed = [action for action in range(n) if action != forbidden]
    masks[np.arange(rows), rng.choice(allowed, size=rows)] = 1
    if forbidden is not None:
        masks[:, forbidden] = 0
    return masks


def biased_policy(model: IPPO, agent: str, action: int) -> MaskableActorCriticPolicy:
    """The agent's policy, with its action head made to prefer ``action`` by far (so that only the mask stops it)."""
    policy = model.policies[agent]
    with th.no_grad():
        policy.action_net.bias.zero_()
        policy.action_net.bias[action] = 50.0
    return policy  # type: ignore[return-value]


def test_masked_agents_get_sb3_contribs_maskable_policy_on_the_observation_without_the_mask() -> None:
    model = IPPO("MlpPolicy", tictactoe(), **TINY)
    for policy in model.policies.values():
        assert isinstance(policy, MaskableActorCriticPolicy) and isinstance(policy, MaskedInputMixin)
        assert policy.observation_space == spaces.Box(0, 1, (3, 3, 2), np.int8)


def test_ten_thousand_sampled_moves_are_all_legal() -> None:
    model = IPPO("MlpPolicy", tictactoe(), **TINY)
    policy = biased_policy(model, P1, action=4)
    rng = np.random.default_rng(0)
    masks = random_masks(rng, 10_000, 9, forbidden=4)  # the preferred move is never legal
    obs = {"observation": rng.integers(0, 2, size=(10_000, 3, 3, 2)).astype(np.int8), "action_mask": masks}
    with th.no_grad():
        actions, _, log_probs = policy(obs_as_tensor(obs, policy.device))
    assert masks[np.arange(10_000), actions.numpy()].all()
    assert th.isfinite(log_probs).all()
    predicted, _ = model.predict({P1: obs}, deterministic=False)
    assert masks[np.arange(10_000), predicted[P1]].all()


def test_predict_never_returns_a_masked_action_even_deterministically() -> None:
    model = IPPO("MlpPolicy", tictactoe(), **TINY)
    biased_policy(model, P1, action=4)
    mask = np.ones(9, dtype=np.int8)
    mask[4] = 0
    obs = {"observation": np.zeros((3, 3, 2), dtype=np.int8), "action_mask": mask}
    action, _ = model.predict({P1: obs}, deterministic=True)
    assert mask[int(action[P1])] == 1
    mask[:] = 0
    mask[7] = 1
    assert int(model.predict({P1: obs}, deterministic=True)[0][P1]) == 7


def test_predict_of_a_masked_agent_without_its_mask_is_a_clear_error() -> None:
    model = IPPO("MlpPolicy", tictactoe(), **TINY)
    with pytest.raises(ValueError, match=r"lacks the entries \['action_mask'\]"):
        model.predict({P1: {"observation": np.zeros((3, 3, 2), dtype=np.int8)}})


def test_the_fresh_log_prob_recomputation_is_masked() -> None:
    # Collect with the biased policy: under the masks, the log-probs recomputed at update time equal those of acting;
    # without the masks they would put almost all the mass on the (often illegal) preferred move.
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=100, **TINY)
    policy = biased_policy(model, P1, action=4)
    model.learn(60)
    trajectories = finished(model, P1)
    batch = build_batch(policy, trajectories, default_update_settings(), preprocess_obs=lambda obs: obs)
    stored = np.concatenate([t.log_probs for t in trajectories])
    np.testing.assert_allclose(batch.old_log_prob.numpy(), stored, atol=1e-5)
    unmasked, _ = _unmasked_log_prob(policy, trajectories)
    assert not np.allclose(unmasked, stored, atol=1e-3)


def _unmasked_log_prob(policy: Any, trajectories: list[Trajectory]) -> tuple[np.ndarray, None]:
    obs = np.concatenate([t.observations["observation"] for t in trajectories])  # type: ignore[index]
    actions = th.as_tensor(np.concatenate([t.actions for t in trajectories]))
    with th.no_grad():
        _, log_prob, _ = MaskableActorCriticPolicy.evaluate_actions(policy, obs_as_tensor(obs, policy.device), actions)
    return log_prob.numpy(), None


def test_every_update_minibatch_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    evaluate_actions = MaskableActorCriticPolicy.evaluate_actions

    def spy(self: Any, obs: Any, actions: th.Tensor, action_masks: Any = None) -> Any:
        calls.append(action_masks is not None and len(action_masks) == len(actions))
        return evaluate_actions(self, obs, actions, action_masks)

    monkeypatch.setattr(MaskableActorCriticPolicy, "evaluate_actions", spy)
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, batch_size=4, shuffle_minibatches=True, **TINY)
    model.learn(60)
    assert model.policy_version >= 2
    # The recomputation, the statistics before and after, and one call per minibatch: every one with masks.
    assert len(calls) >= 4 * model.policy_version and all(calls)


def test_masked_groups_train_one_agent_at_a_time_without_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = IPPO("MlpPolicy", tictactoe(), batched=True, **TINY)
    assert not [warning for warning in caught if "one agent at a time" in str(warning.message)]
    assert model.groups == {"player": [P1, P2]} and not stacked_groups(model)


def test_a_plain_actor_critic_policy_class_cannot_take_masks() -> None:
    from stable_baselines3.common.policies import ActorCriticPolicy

    class MyPolicy(ActorCriticPolicy):
        pass

    with pytest.raises(ValueError, match="cannot apply it"):
        IPPO(MyPolicy, tictactoe(), **TINY)


def test_a_mask_that_does_not_fit_the_action_space_is_refused() -> None:
    env = MaskedParallelEnv(n_actions=4, mask_size=5)
    with pytest.raises(ValueError, match=r"action_mask space .* needs a mask of 4 entries"):
        IPPO("MlpPolicy", env, **TINY)


# --- save, load, export -------------------------------------------------------------------------------------------


@pytest.fixture
def trained() -> IPPO:
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, **TINY)
    model.learn(80)
    return model


def some_positions(n: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "observation": rng.integers(0, 2, size=(n, 3, 3, 2)).astype(np.int8),
        "action_mask": random_masks(rng, n, 9),
    }


def test_save_and_load_keep_masked_predictions(trained: IPPO, tmp_path: pathlib.Path) -> None:
    trained.save(tmp_path / "model.zip")
    loaded = IPPO.load(tmp_path / "model.zip", env=tictactoe())
    positions = some_positions()
    for agent in (P1, P2):
        expected = trained.predict({agent: positions}, deterministic=True)[0][agent]
        actual = loaded.predict({agent: positions}, deterministic=True)[0][agent]
        assert np.array_equal(expected, actual) and positions["action_mask"][np.arange(64), actual].all()
    loaded.learn(40, reset_num_timesteps=False)
    assert loaded.policy_version > trained.policy_version


def test_export_of_a_masked_agent_is_a_maskable_ppo_zip_with_the_same_moves(trained: IPPO, tmp_path: pathlib.Path) -> None:
    trained.export_agent(P2, tmp_path / "player_2.zip")
    exported = MaskablePPO.load(tmp_path / "player_2.zip")
    assert type(exported.policy) is MaskableActorCriticPolicy  # sb3-contrib's own class: no sb3_ippo needed to load
    positions = some_positions()
    expected = trained.predict({P2: positions}, deterministic=True)[0][P2]
    actions, _ = exported.predict(positions["observation"], action_masks=positions["action_mask"], deterministic=True)
    assert np.array_equal(actions, expected)


def test_export_of_a_masked_agent_carries_its_observation_statistics(tmp_path: pathlib.Path) -> None:
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, normalize_obs=True, **TINY)
    model.learn(80)
    assert model.obs_normalizers is not None and set(model.obs_normalizers[P1].obs_rms) == {"observation"}  # type: ignore[arg-type]
    model.export_agent(P1, tmp_path / "player_1.zip")
    exported = MaskablePPO.load(tmp_path / "player_1.zip")
    positions = some_positions()
    expected = model.predict({P1: positions}, deterministic=True)[0][P1]
    actions, _ = exported.predict(positions["observation"], action_masks=positions["action_mask"], deterministic=True)
    assert np.array_equal(actions, expected)


# --- a parallel env with masks --------------------------------------------------------------------------------------


class MaskedParallelEnv(ParallelEnv):
    """Two agents pick one of ``n_actions`` each step; some moves are illegal (the env raises on one). Reward 1 for
    the highest legal move. Ten steps an episode."""

    metadata: ClassVar[dict[str, Any]] = {"name": "masked_parallel", "render_modes": [], "is_parallelizable": True}

    def __init__(self, n_actions: int = 4, mask_size: int | None = None) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.n_actions = n_actions
        self._observation_space = spaces.Dict(
            {
                "observation": spaces.Box(0, 1, (n_actions,), np.float32),
                "action_mask": spaces.Box(0, 1, (mask_size or n_actions,), np.int8),
            }
        )
        self._action_space = spaces.Discrete(n_actions)
        self.rng = np.random.default_rng()
        self.masks: dict[str, np.ndarray] = {}
        self.illegal_moves = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def _observe(self) -> dict[str, dict[str, np.ndarray]]:
        self.masks = {agent: random_masks(self.rng, 1, self.n_actions)[0] for agent in self.agents}
        return {agent: {"observation": mask.astype(np.float32), "action_mask": mask} for agent, mask in self.masks.items()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.steps = 0
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple:
        rewards = {}
        for agent, action in actions.items():
            if not self.masks[agent][action]:
                self.illegal_moves += 1
                raise ValueError(f"illegal move {action} of {agent}")
            rewards[agent] = float(action == np.flatnonzero(self.masks[agent])[-1])
        self.steps += 1
        done = self.steps >= 10
        obs = self._observe()
        if done:
            self.agents = []
        flags = dict.fromkeys(actions, done)
        return obs, rewards, flags, dict.fromkeys(actions, False), {agent: {} for agent in actions}


def test_a_parallel_env_with_masks_trains_on_legal_moves_only() -> None:
    env = make_vec_env(MaskedParallelEnv, n_envs=2, seed=0)
    model = IPPO("MultiInputPolicy", env, n_episodes=2, **TINY)
    model.learn(200)
    assert model.policy_version >= 2
    assert all(copy.illegal_moves == 0 for copy in env.envs)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------------------------------
# Frozen opponents and the self-play pool
# ----------------------------------------------------------------------------------------------------------------


def parameters_of(model: IPPO, agent: str) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policies[agent].parameters()]


def test_a_frozen_seat_never_trains_and_stores_nothing() -> None:
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, opponents={P2: "random"}, **TINY)
    before = parameters_of(model, P2)
    learner_before = parameters_of(model, P1)
    model.learn(100)
    assert model.policy_version >= 2
    assert not model.buffers[P2].finished and P2 not in model.update_stats
    assert all(th.equal(a, b) for a, b in zip(before, parameters_of(model, P2), strict=True))
    assert not all(th.equal(a, b) for a, b in zip(learner_before, parameters_of(model, P1), strict=True))


def test_against_a_frozen_opponent_the_learners_transition_spans_the_reply() -> None:
    # The opponent always answers with its first legal move; the learner's hand-played moves win on its third move.
    first_legal = lambda obs: np.argmax(obs["action_mask"], axis=1)  # noqa: E731
    model = IPPO("MlpPolicy", tictactoe(), n_episodes=100, opponents={P2: first_legal}, **TINY)
    model._act = ScriptedMoves([4, 2, 6])  # type: ignore[method-assign]  # O replies 0, then 1; X's 2-4-6 diagonal wins
    model.learn(5)
    (x,) = finished(model, P1)
    assert x.actions.tolist() == [4, 2, 6] and x.rewards.tolist() == [0.0, 0.0, 1.0] and x.terminated
    assert model.ep_info_buffer[0]["agent_returns"] == {P1: 1.0, P2: -1.0}


def test_the_random_opponent_plays_uniformly_among_legal_moves() -> None:
    opponent = RandomOpponent({P1: spaces.Discrete(9)}, seed=0)
    mask = np.zeros((9000, 9), dtype=np.int8)
    mask[:, [1, 4, 7]] = 1
    moves = opponent.act(P1, {"observation": np.zeros((9000, 3, 3, 2)), "action_mask": mask})
    counts = np.bincount(moves, minlength=9)
    assert counts[[0, 2, 3, 5, 6, 8]].sum() == 0
    assert np.all(np.abs(counts[[1, 4, 7]] - 3000) < 200)


def test_any_models_predict_can_be_the_opponent(trained: IPPO, tmp_path: pathlib.Path) -> None:
    trained.export_agent(P2, tmp_path / "player_2.zip")
    for opponent in (trained, MaskablePPO.load(tmp_path / "player_2.zip")):
        model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, opponents={P2: opponent}, **TINY)
        model.learn(60)
        assert model.policy_version >= 1 and not model.buffers[P2].finished


def test_unknown_seats_and_opponents_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"seats \['player_3'\]"):
        IPPO("MlpPolicy", tictactoe(), opponents={"player_3": "random"}, **TINY)
    with pytest.raises(ValueError, match="Unknown opponent 'minimax'"):
        IPPO("MlpPolicy", tictactoe(), opponents={P2: "minimax"}, **TINY)
    with pytest.raises(ValueError, match="freezes every seat"):
        IPPO("MlpPolicy", tictactoe(), opponents={P1: "random", P2: "random"}, **TINY)
    with pytest.raises(ValueError, match="self_play_pool needs two seats"):
        IPPO("MlpPolicy", tictactoe(), opponents={P2: "random"}, self_play_pool=dict(snapshot_every=1, size=2), **TINY)
    with pytest.raises(ValueError, match=r"self_play_pool must be dict\(snapshot_every=K, size=M\)"):
        IPPO("MlpPolicy", tictactoe(), self_play_pool=dict(every=1, size=2), **TINY)


def test_the_pool_keeps_the_last_snapshots_taken_every_k_updates() -> None:
    pool = dict(snapshot_every=2, size=2)
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, share_parameters=True, self_play_pool=pool, **TINY)
    model.learn(200)
    assert model._seats is not None and model._seats.pool is not None
    assert model.policy_version >= 5
    last = model.policy_version - model.policy_version % 2
    assert list(model._seats.pool.versions) == [last - 2, last]
    # A snapshot is a frozen copy: the learner has moved on since the oldest one.
    oldest = model._seats.pool.snapshots[0].policies[P1]
    assert oldest is not model.policies[P1]
    assert not all(th.equal(a, b) for a, b in zip(oldest.parameters(), model.policies[P1].parameters(), strict=True))


def test_with_the_pool_one_seat_of_each_episode_is_played_by_a_snapshot() -> None:
    pool = dict(snapshot_every=1, size=4)
    model = IPPO("MlpPolicy", tictactoe(n_envs=3), n_episodes=1000, share_parameters=True, self_play_pool=pool, **TINY)
    model.learn(300)
    trajectories = len(finished(model, P1)) + len(finished(model, P2))
    # One learner trajectory per finished episode (the snapshot's seat stores nothing); both seats get some.
    assert trajectories == len(model.ep_info_buffer) > 10
    assert finished(model, P1) and finished(model, P2)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation of games
# ----------------------------------------------------------------------------------------------------------------


class RandomModel:
    """A "model" that plays uniformly random legal moves through ``predict``, like IPPO's dict interface."""

    def __init__(self, seed: int) -> None:
        self.opponent = RandomOpponent({P1: spaces.Discrete(9), P2: spaces.Discrete(9)}, seed)

    def predict(self, observation: dict, deterministic: bool = True) -> tuple[dict, None]:
        return {agent: self.opponent.act(agent, obs) for agent, obs in observation.items()}, None


def test_outcomes_compare_the_seats_returns() -> None:
    assert outcome({P1: 1.0, P2: -1.0}, P1) == 1 and outcome({P1: 1.0, P2: -1.0}, P2) == -1
    assert outcome({P1: 0.0, P2: 0.0}, P2) == 0
    assert SeatRecord(wins=6, draws=1, losses=3).non_loss_rate == pytest.approx(0.7)


def test_random_against_random_gives_tictactoes_known_rates() -> None:
    # Uniform random play: the first player wins 58.5%, the second 28.8%, 12.7% are draws. Bounds: 3.5 sigma.
    records = evaluate_policy(RandomModel(0), tictactoe(n_envs=4, seed=3), n_eval_episodes=1000, opponent="random")
    assert isinstance(records, dict) and set(records) == {P1, P2}
    first, second = records[P1], records[P2]
    assert first.n_games == second.n_games == 1000
    assert abs(first.win_rate - 0.585) < 0.055 and abs(first.draw_rate - 0.127) < 0.037
    assert abs(second.win_rate - 0.288) < 0.05 and abs(second.loss_rate - 0.585) < 0.055


def test_evaluation_against_a_model_opponent(trained: IPPO) -> None:
    records = evaluate_policy(trained, tictactoe_v3.env(), n_eval_episodes=5, opponent=trained)
    assert isinstance(records, dict) and all(record.n_games == 5 for record in records.values())


def test_evaluation_with_an_opponent_refuses_team_return_options(trained: IPPO) -> None:
    with pytest.raises(ValueError, match="win, draw and loss rates per seat"):
        evaluate_policy(trained, tictactoe(), opponent="random", return_episode_rewards=True)


def test_eval_callback_tracks_the_win_rate_against_random(tmp_path: pathlib.Path) -> None:
    model = IPPO("MlpPolicy", tictactoe(n_envs=2), n_episodes=2, share_parameters=True, **TINY)
    callback = MultiAgentEvalCallback(
        tictactoe(n_envs=2, seed=100),
        n_eval_episodes=4,
        eval_freq=20,
        opponent="random",
        log_path=str(tmp_path),
        best_model_save_path=str(tmp_path),
        callback_on_new_best=StopTrainingOnRewardThreshold(reward_threshold=0.0, verbose=0),
        verbose=0,
    )
    model.learn(200, callback=callback)
    # The first evaluation sets a best win rate > -inf >= 0.0: training stops there.
    assert model.num_timesteps == 40
    log = np.load(tmp_path / "evaluations.npz")
    assert log["timesteps"].tolist() == [40] and log["win_rates"].shape == (1, 2)
    assert callback.best_mean_reward == pytest.approx(float(np.mean(log["win_rates"])))
    assert (tmp_path / "best_model.zip").exists()


# ----------------------------------------------------------------------------------------------------------------
# Connect four and the command line
# ----------------------------------------------------------------------------------------------------------------


def test_connect_four_self_play_trains_from_both_seats() -> None:
    env = make_vec_env(connect_four_v3.env, n_envs=2, seed=0)
    model = IPPO("MlpPolicy", env, n_episodes=2, share_parameters=True, **TINY)
    model.learn(200)
    assert model.possible_agents == ["player_0", "player_1"]
    assert model.policies["player_0"] is model.policies["player_1"] and model.policy_version >= 1


class FirstVersion(BaseCallback):
    """Keeps the weights of version 1 and stops learn once they act."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[str, th.Tensor] | None = None
        self.learner_ran = False

    def _on_step(self) -> bool:
        self.learner_ran |= self.model._learner is not None
        if self.model.policy_version >= 1 and self.weights is None:
            self.weights = {name: p.detach().clone() for name, p in self.model.policies[P1].named_parameters()}
        return self.weights is None


def test_masked_policies_train_in_the_learner_process_as_in_the_main_one() -> None:
    # Self-play and a snapshot pool: the masked update runs in the learner process; its first version equals the
    # synchronous one, which it could not if the learner left the masks out of the recomputation or the update.
    kwargs: dict[str, Any] = dict(n_episodes=2, share_parameters=True, self_play_pool=dict(snapshot_every=1, size=2), **TINY)
    runs = {}
    for async_training in (False, True):
        first = FirstVersion()
        model = IPPO("MlpPolicy", tictactoe(n_envs=2), async_training=async_training, **kwargs)
        model.learn(200, callback=first)
        assert first.weights is not None and model._learner is None
        assert first.learner_ran == async_training
        runs[async_training] = first.weights
    for name, tensor in runs[False].items():
        assert th.equal(runs[True][name], tensor), name


def iter_lines(text: str) -> Iterator[str]:
    yield from (line for line in text.splitlines() if line.strip())


def test_cli_trains_a_classic_game_with_its_defaults(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    from sb3_ippo.cli import main

    out = tmp_path / "ttt"
    main(
        [
            "train", "--env", "pettingzoo.classic.tictactoe_v3", "--timesteps", "200", "--n-envs", "2", "--out", str(out),
            "--eval-episodes", "4", "--no-progress-bar", "--n-epochs", "2", "--policy-kwargs", "dict(net_arch=[16])",
        ]
    )  # fmt: skip
    model = IPPO.load(out / "model.zip")
    assert model.share_parameters is True
    printed = list(iter_lines(capsys.readouterr().out))
    assert "Final evaluation: 4 games per seat against a uniformly random player, deterministic actions" in printed
    assert any(line.strip().startswith("player_1  win ") for line in printed)


def test_cli_evaluate_of_a_game_gives_the_same_results_run_after_run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    from sb3_ippo.cli import main

    out = tmp_path / "ttt"
    main(
        [
            "train", "--env", "pettingzoo.classic.tictactoe_v3", "--timesteps", "100", "--n-envs", "2", "--out", str(out),
            "--eval-episodes", "0", "--no-progress-bar", "--n-epochs", "1", "--policy-kwargs", "dict(net_arch=[8])",
        ]
    )  # fmt: skip
    capsys.readouterr()
    outputs = []
    for _ in range(2):  # the random opponent and the sampled actions follow --seed
        main(["evaluate", str(out), "--episodes", "20", "--stochastic"])
        outputs.append(capsys.readouterr().out)
    assert "against a uniformly random player" in outputs[0] and outputs[0] == outputs[1]


def test_cli_eval_freq_on_a_game_scores_by_the_win_rate(tmp_path: pathlib.Path) -> None:
    from sb3_ippo.cli import main

    out = tmp_path / "ttt"
    main(
        [
            "train", "--env", "pettingzoo.classic.tictactoe_v3", "--timesteps", "200", "--n-envs", "2", "--out", str(out),
            "--eval-episodes", "0", "--no-progress-bar", "--n-epochs", "1", "--policy-kwargs", "dict(net_arch=[8])",
            "--eval-freq", "100", "--n-eval-episodes", "4",
        ]
    )  # fmt: skip
    with (out / "progress.csv").open() as file:
        header = file.readline().rstrip("\n").split(",")
    assert "eval/win_rate" in header  # a game's team return is 0 whoever wins
    assert (out / "best_model.zip").is_file()
