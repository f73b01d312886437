"""``vec_env_cls="ray"`` on a Ray cluster of three nodes, simulated on this machine (``ray.cluster_utils.Cluster``): the
env runners span the nodes, a seeded run trains as with in-process copies, and a node lost while ``learn`` runs has its
runners started anew on the nodes left (``on_env_error="restart"``), with the loss counted and logged. Starting the
cluster and its actors takes a while on a small machine: the tests are slow ones (``-m slow``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo import IPPO, make_vec_env
from tests.envs import DyingAgentsEnv
from tests.helpers import assert_same_parameters, closing, fail_after, parameters, record_logs

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow

N_ENVS, N_WORKERS = 6, 3
# Small nodes: one CPU each, and an object store far below the default (a share of the machine's memory).
NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head node and two more; the tests join it with ``make_vec_env(..., ray_address=cluster.address)``."""
    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def make_model(env: Any) -> IPPO:
    return IPPO("MlpPolicy", env, n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)


def ray_copies(cluster: Any, **kwargs: Any) -> Any:
    return make_vec_env(
        DyingAgentsEnv, N_ENVS, seed=0, vec_env_cls="ray", n_workers=N_WORKERS, ray_address=cluster.address, **kwargs
    )


def test_runners_span_the_nodes_and_train_as_copies_in_this_process(cluster: Any) -> None:
    with fail_after(240), closing(ray_copies(cluster)) as vec_env:
        nodes = vec_env.runner_nodes()
        assert sorted(nodes) == sorted(node["NodeID"] for node in ray.nodes() if node["Alive"]), "one runner per node"
        on_cluster = make_model(vec_env).learn(N_ENVS * 30)
    on_this_process = make_model(make_vec_env(DyingAgentsEnv, N_ENVS, seed=0)).learn(N_ENVS * 30)
    assert on_cluster.policy_version == on_this_process.policy_version >= 3
    assert_same_parameters(parameters(on_cluster), parameters(on_this_process))


class NodeLoss(BaseCallback):
    """Removes ``node`` from the cluster at the ``at_step``-th vectorized step; checks, copy by copy, that every episode
    the env reports is as long as the steps this process stepped that copy since its last reset (no step counted twice,
    none replayed by a runner started anew)."""

    def __init__(self, cluster: Any, node: Any, at_step: int) -> None:
        super().__init__()
        self.cluster, self.node, self.at_step = cluster, node, at_step
        self.steps_since_reset = np.zeros(N_ENVS, dtype=int)
        self.restarted_copies: list[int] = []
        self.episodes_after_restart = 0

    def _on_step(self) -> bool:
        self.steps_since_reset += 1
        for env_idx, info in enumerate(self.locals["infos"]):
            if info.get("env_restarted"):
                self.restarted_copies.append(env_idx)
            elif "episode" in info:
                assert info["episode"]["l"] == self.steps_since_reset[env_idx], f"copy {env_idx}"
                self.episodes_after_restart += bool(self.restarted_copies)
        self.steps_since_reset[self.locals["dones"]] = 0
        if self.n_calls == self.at_step:
            self.cluster.remove_node(self.node)
        return True


def test_a_node_lost_during_learn_has_its_runners_restarted_elsewhere(cluster: Any) -> None:
    with fail_after(240), closing(ray_copies(cluster, on_env_error="restart")) as vec_env:
        nodes = vec_env.runner_nodes()
        lost = next(node for node in cluster.worker_nodes if node.node_id in nodes)
        lost_copies = [
            env_idx for worker, node_id in enumerate(nodes) if node_id == lost.node_id for env_idx in vec_env._slices[worker]
        ]
        model = make_model(vec_env)
        logs = record_logs(model)
        # DyingAgentsEnv's episodes last 6 steps: at step 10, every copy is in the middle of one.
        callback = NodeLoss(cluster, lost, at_step=10)
        model.learn(N_ENVS * 40, callback=callback)
        assert model.num_timesteps >= N_ENVS * 40, "training finished"
        assert sorted(callback.restarted_copies) == lost_copies
        assert callback.episodes_after_restart > 0
        assert lost.node_id not in vec_env.runner_nodes(), "the lost runner was started anew on a node still there"
    assert model.env_restarts == len(lost_copies)
    assert model.episodes_lost > 0  # the trajectories open in the lost copies: dropped, never trained on
    last = logs.dumps[-1]
    assert last["rollout/env_restarts"] == len(lost_copies)
    assert last["rollout/episodes_lost"] == model.episodes_lost
