"""What several test modules use: IPPO's update settings for calling the update functions directly, small models
and policies, the checks of parameters and actions, and the vectorized env's contract. Test modules import from
here, never from each other; the fixtures they share are in ``conftest.py``."""

from __future__ import annotations

import copy
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from mpe2 import simple_spread_v3
from pettingzoo.classic import tictactoe_v3
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy

from sb3_ippo import IPPO, MAPPO, make_vec_env
from sb3_ippo.common.buffer import Trajectory, stack_obs
from sb3_ippo.common.critic_input import has_critic_input
from sb3_ippo.ippo.ippo import default_update_settings
from sb3_ippo.update.settings import UpdateSettings
from sb3_ippo.vec_env import MultiAgentVecEnv
from sb3_ippo.games.turn_based import TurnBasedMultiAgentVecEnv
from tests.envs import DyingAgentsEnv, HeterogeneousEnv, VariableLengthEnv

GAMMA, GAE_LAMBDA = 0.99, 0.95


# The update the hand-written reference computations of the tests follow: the reference's sequential minibatches of the
# whole batch and its KL stop (IPPO's defaults before issue 32), whatever the defaults are now.
REFERENCE_UPDATE: dict[str, Any] = dict(batch_size=None, n_epochs=20, target_kl=0.02, shuffle_minibatches=False)


def settings(**overrides: Any) -> UpdateSettings:
    """IPPO's update settings with the reference's passes (:data:`REFERENCE_UPDATE`), the tests' discount
    (:data:`GAMMA`, :data:`GAE_LAMBDA`) and ``overrides``."""
    return default_update_settings(**{**REFERENCE_UPDATE, "gamma": GAMMA, "gae_lambda": GAE_LAMBDA, **overrides})


def stacked_groups(model: IPPO) -> set[str]:
    """The names of the model's groups whose members act and train as one batch (stacked networks)."""
    return {name for name, runner in model._runners.items() if runner.stacked is not None}


# --- Models on DyingAgentsEnv, and what they log ----------------------------------------------------------------------

# DyingAgentsEnv: agents agent_0, agent_1, agent_2 leave after 2, 4 and 6 steps, so each episode gives one trajectory
# of length 2, 4 and 6, and lasts 6 env steps.
TRAJECTORY_LENGTHS = {"agent_0": 2, "agent_1": 4, "agent_2": 6}
EPISODE_LENGTH = 6


# The algorithms that share IPPO's contract; MAPPO's critic sees the joint observation (the test envs have no state).
ALGORITHMS = [IPPO, MAPPO]


def make_model(env: Any = None, algo: type[IPPO] = IPPO, **kwargs: Any) -> IPPO:
    # The reference's rule (whole episodes, 2 per agent) and update, small: what the tests' expectations count.
    params: dict[str, Any] = dict(
        REFERENCE_UPDATE, n_episodes=2, rollout_len=None, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0
    )
    if algo is MAPPO:
        params["critic_input"] = "joint_obs"
    params.update(kwargs)
    return algo("MlpPolicy", env if env is not None else DyingAgentsEnv(), **params)


def make_algo_vec_env(algo: type[IPPO], env_fn: Callable[..., Any], **kwargs: Any) -> MultiAgentVecEnv:
    """``make_vec_env(env_fn, **kwargs)``, with the critic input of :func:`make_model`'s MAPPO when ``algo`` is MAPPO."""
    return make_vec_env(env_fn, critic_input="joint_obs" if algo is MAPPO else None, **kwargs)


class RecordingOutput(KVWriter):
    """A logger output that keeps every dump."""

    def __init__(self) -> None:
        self.dumps: list[dict[str, Any]] = []

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        self.dumps.append(dict(key_values))

    def close(self) -> None:
        pass


def record_logs(model: IPPO) -> RecordingOutput:
    output = RecordingOutput()
    model.set_logger(Logger(folder=None, output_formats=[output]))
    return output


# --- Comparing models: parameters, optimizer state, actions -----------------------------------------------------------


def parameters(model: IPPO) -> dict[str, dict[str, th.Tensor]]:
    return {
        agent: {name: p.detach().clone() for name, p in policy.named_parameters()} for agent, policy in model.policies.items()
    }


def assert_same_parameters(first: dict[str, dict[str, th.Tensor]], second: dict[str, dict[str, th.Tensor]]) -> None:
    """Every agent's every parameter is exactly equal in both (as :func:`parameters` or ``state_dict`` give them)."""
    assert first.keys() == second.keys()
    for agent, params in first.items():
        for name, tensor in params.items():
            assert th.equal(second[agent][name], tensor), f"agent {agent!r}, parameter {name}"


def assert_same_optimizer_state(first: th.optim.Optimizer, second: th.optim.Optimizer) -> None:
    first_state, second_state = first.state_dict(), second.state_dict()
    assert first_state["param_groups"] == second_state["param_groups"]
    assert first_state["state"].keys() == second_state["state"].keys()
    for index, param_state in first_state["state"].items():
        for name, value in param_state.items():
            th.testing.assert_close(value, second_state["state"][index][name])


def observation_batch(model: IPPO, n: int = 16, seed: int = 0) -> dict[str, Any]:
    """``n`` observations per agent, drawn from each agent's observation space."""
    batch = {}
    for offset, agent in enumerate(model.possible_agents):
        space = model.observation_spaces[agent]
        if has_critic_input(space):  # MAPPO: what the agent observes, without the critic's input
            space = space["obs"]  # type: ignore[index]
        space.seed(seed + offset)
        batch[agent] = np.stack([space.sample() for _ in range(n)])
    return batch


def assert_same_actions(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> None:
    assert first.keys() == second.keys()
    for agent in first:
        np.testing.assert_array_equal(first[agent], second[agent], err_msg=f"agent {agent!r}")


# --- Policies and trajectories for calling the update directly --------------------------------------------------------

OBS = spaces.Box(-1.0, 1.0, (4,), np.float32)


def make_policies(
    n: int, action_space: spaces.Space, observation_space: spaces.Space = OBS, learning_rate: float = 1e-2
) -> list[ActorCriticPolicy]:
    if isinstance(observation_space, spaces.Dict):
        policy_class: type[ActorCriticPolicy] = MultiInputActorCriticPolicy
    elif len(observation_space.shape or ()) == 3:
        policy_class = ActorCriticCnnPolicy
    else:
        policy_class = ActorCriticPolicy
    policies = []
    for seed in range(n):
        th.manual_seed(seed)
        kwargs: dict[str, Any] = {}
        if policy_class is ActorCriticCnnPolicy:
            kwargs = dict(features_extractor_kwargs=dict(features_dim=8))
        policies.append(policy_class(observation_space, action_space, lambda _: learning_rate, net_arch=[16], **kwargs))
    return policies


def sampled_trajectories(policy: ActorCriticPolicy, ends: list[tuple[int, bool]], seed: int = 0) -> list[Trajectory]:
    """Trajectories whose actions, values and log-probs the policy sampled, as collection stores them."""
    rng = np.random.default_rng(seed)
    policy.observation_space.seed(seed)
    trajectories = []
    for length, terminated in ends:
        observations = stack_obs([policy.observation_space.sample() for _ in range(length)])
        with th.no_grad():
            actions, values, log_probs = policy(policy.obs_to_tensor(observations)[0])
        trajectories.append(
            Trajectory(
                observations=observations,
                actions=actions.numpy(),
                rewards=rng.normal(size=length).astype(np.float32),
                values=values.flatten().numpy(),
                log_probs=log_probs.numpy(),
                terminated=terminated,
                bootstrap_obs=None if terminated else policy.observation_space.sample(),
                policy_version=0,
            )
        )
    return trajectories


# --- Trajectories of FlakyEnv (tests/flaky_envs.py) -------------------------------------------------------------------

FLAKY_MAX_STEPS = 6  # FlakyEnv's default max_steps


def episode_steps(obs: np.ndarray) -> np.ndarray:
    """The step within the episode of FlakyEnv observations ``[t / max_steps, target]``."""
    return np.rint(np.asarray(obs)[..., 0] * FLAKY_MAX_STEPS).astype(int)


def record_trajectories(model: IPPO) -> list[Trajectory]:
    """Every trajectory the model's updates drain from now on."""
    drained: list[Trajectory] = []
    for buffer in model.buffers.values():
        drain = buffer.drain

        def recording_drain(*args: Any, drain: Any = drain) -> list[Trajectory]:
            batch = drain(*args)
            drained.extend(batch)
            return batch

        buffer.drain = recording_drain  # type: ignore[method-assign]
    return drained


def assert_unbroken(trajectories: list[Trajectory]) -> None:
    """Every trajectory is one piece of one episode: its steps count 0, 1, 2, ... (a restart would start again at 0)."""
    assert trajectories
    for trajectory in trajectories:
        assert episode_steps(trajectory.observations).tolist() == list(range(len(trajectory)))


# --- Turn-based games -------------------------------------------------------------------------------------------------

P1, P2 = "player_1", "player_2"


def tictactoe(n_envs: int = 1, seed: int = 0, **kwargs: Any) -> TurnBasedMultiAgentVecEnv:
    env = make_vec_env(tictactoe_v3.env, n_envs=n_envs, seed=seed, env_kwargs=kwargs or None)
    assert isinstance(env, TurnBasedMultiAgentVecEnv)
    return env


# --- The vectorized env: random rollouts, their data compared, tests that fail instead of hanging ---------------------


def action_sampler(vec_env: MultiAgentVecEnv, seed: int = 0) -> Callable[[], dict[str, np.ndarray]]:
    """Random actions ``{agent: (n_envs, *act_shape)}``, the same sequence for the same seed."""
    action_spaces = {agent: copy.deepcopy(space) for agent, space in vec_env.action_spaces.items()}
    for offset, space in enumerate(action_spaces.values()):
        space.seed(seed + offset)

    def sample() -> dict[str, np.ndarray]:
        return {agent: np.stack([space.sample() for _ in range(vec_env.num_envs)]) for agent, space in action_spaces.items()}

    return sample


def oracle_actions(step_obs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The rewarded actions of DyingAgentsEnv and its subclasses, whose observation is ``[t / max_steps, target]``."""
    return {agent: obs[:, 1].astype(np.int64) for agent, obs in step_obs.items()}


def without_wall_time(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**info, "episode": {key: val for key, val in info["episode"].items() if key != "t"}} if "episode" in info else info
        for info in infos
    ]


def rollout(vec_env: MultiAgentVecEnv, n_steps: int, action_seed: int = 0) -> list[Any]:
    """The reset observations, then every step's data (episode wall times left out), under random actions."""
    sample = action_sampler(vec_env, action_seed)
    data: list[Any] = [vec_env.reset()]
    for _ in range(n_steps):
        step = vec_env.step_agents(sample())
        data.append(step._replace(infos=without_wall_time(step.infos)))
    return data


def assert_same(actual: Any, expected: Any, where: str = "data") -> None:
    """Recursive equality of nested dicts, lists, tuples and arrays."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), f"{where}: keys {actual} != {expected}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{where}: length {len(actual)} != {len(expected)}"
        for idx, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{idx}]")
    elif isinstance(expected, np.ndarray):
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@contextmanager
def fail_after(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the test, instead of hanging the test run, if it takes more than ``seconds``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the test hung for {seconds} seconds")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def closing(vec_env: MultiAgentVecEnv) -> Iterator[MultiAgentVecEnv]:
    try:
        yield vec_env
    finally:
        vec_env.close()


# Envs on which every vec_env_cls gives, step for step, the data of "dummy" (the same seed, the same actions).
SAME_DATA_ENVS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "heterogeneous": (HeterogeneousEnv, {}),
    "dying_and_joining": (DyingAgentsEnv, {"join_steps": {"agent_2": 3}}),
    "variable_length": (VariableLengthEnv, {"truncate": True}),
    "simple_spread": (simple_spread_v3.parallel_env, {"N": 3, "max_cycles": 4}),
}


# --- The vectorized env's contract, the same for every vec_env_cls ----------------------------------------------------
# test_vec_env.py checks it on "dummy" and "subproc", test_ray_vec_env.py on "ray".


def assert_max_episode_steps_truncates_every_episode(vec_env_cls: str) -> None:
    env_kwargs = {"death_steps": {"agent_0": None, "agent_1": None}, "max_steps": 100}
    with closing(make_vec_env(DyingAgentsEnv, n_envs=3, vec_env_cls=vec_env_cls, env_kwargs=env_kwargs)) as vec_env:
        vec_env.max_episode_steps = 2
        obs = vec_env.reset()
        ends = []
        for _ in range(4):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
            ends.append(step.dones.tolist())
            if step.dones.any():
                assert step.truncations["agent_0"].all() and not step.terminations["agent_0"].any()
                assert [info["episode"]["l"] for info in step.infos] == [2, 2, 2]
        assert ends == [[False] * 3, [True] * 3, [False] * 3, [True] * 3]


def assert_get_attr_reads_each_copys_attribute(vec_env_cls: str) -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=3, vec_env_cls=vec_env_cls)) as vec_env:
        vec_env.reset()
        assert vec_env.get_attr("max_steps") == [6, 6, 6]
        assert vec_env.get_attr("agents", indices=[2]) == [["agent_0", "agent_1", "agent_2"]]


def assert_set_attr_changes_only_the_chosen_copies(vec_env_cls: str) -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=3, vec_env_cls=vec_env_cls)) as vec_env:
        obs = vec_env.reset()
        vec_env.set_attr("reward_scale", 10.0, indices=[0, 2])
        step = vec_env.step_agents(oracle_actions(obs))
        assert step.rewards["agent_0"].tolist() == [10.0, 1.0, 10.0]


def assert_env_method_calls_the_chosen_copies(vec_env_cls: str) -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=3, vec_env_cls=vec_env_cls)) as vec_env:
        assert vec_env.env_method("target", "agent_1", t=2, indices=[0, 2]) == [1, 1]
