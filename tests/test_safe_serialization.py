"""Model files that load without running code: the safetensors format, and ``IPPO.load(zip, trusted=False)``.

The safe paths are checked with every unpickler patched to raise (:func:`no_unpickling`): ``pickle.load``,
``pickle.loads``, ``pickle.Unpickler``, ``cloudpickle.load``, ``cloudpickle.loads`` and ``torch.load`` (the last
one, for zips only, still allowed with ``weights_only=True``, torch's restricted loader of tensors).
"""

from __future__ import annotations

import base64
import io
import json
import pathlib
import pickle
import re
import time
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from mpe2 import simple_adversary_v3
from safetensors import safe_open
from safetensors.torch import save as save_safetensors_bytes
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.utils import LinearSchedule
from torch import nn

from sb3_ippo import IPPO, make_vec_env, serialization
from sb3_ippo.serialization import (
    JSON_STATE_KEY,
    MAX_FILE_ELEMENTS,
    MAX_SPACE_ELEMENTS,
    ModelFileError,
    NotSerializableError,
    UntrustedContentError,
    decode_space,
    encode_space,
)
from tests.envs import DyingAgentsEnv, HeterogeneousEnv
from tests.helpers import (
    P2,
    assert_same_actions,
    assert_same_optimizer_state,
    assert_same_parameters,
    make_model,
    observation_batch,
    parameters,
    tictactoe,
)


class Unpickled(AssertionError):
    """Raised by the patched unpicklers."""


@contextmanager
def no_unpickling(allow_torch_weights_only: bool = False) -> Iterator[list[str]]:
    """Make every unpickler raise; yields the list of the calls that were refused (and, if allowed, of the
    ``torch.load(weights_only=True)`` calls, prefixed "allowed")."""
    calls: list[str] = []
    real_torch_load = th.load

    def refuse(name: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise Unpickled(f"{name} was called")

        return refused

    def torch_load(*args: Any, **kwargs: Any) -> Any:
        if allow_torch_weights_only and kwargs.get("weights_only") is True:
            calls.append("allowed torch.load(weights_only=True)")
            return real_torch_load(*args, **kwargs)
        calls.append("torch.load")
        raise Unpickled("torch.load was called without weights_only=True")

    class RefusingUnpickler:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append("pickle.Unpickler")
            raise Unpickled("pickle.Unpickler was used")

    patches = [
        (pickle, "load", refuse("pickle.load")),
        (pickle, "loads", refuse("pickle.loads")),
        (pickle, "Unpickler", RefusingUnpickler),
        (cloudpickle, "load", refuse("cloudpickle.load")),
        (cloudpickle, "loads", refuse("cloudpickle.loads")),
        (th, "load", torch_load),
    ]
    originals = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, replacement in patches:
        setattr(module, name, replacement)
    try:
        yield calls
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[IPPO, pathlib.Path, pathlib.Path]:
    """A model with every kind of state (normalizations, stale episodes, updates), saved in both formats."""
    env = make_vec_env(DyingAgentsEnv, n_envs=3, seed=0)
    model = make_model(env, normalize_obs=True, normalize_returns=True, max_version_lag=0, time_limit_bootstrap=False)
    model.learn(72)
    assert model.policy_version >= 2 and model.stale_episodes_dropped > 0
    directory = tmp_path_factory.mktemp("safe")
    model.save(directory / "model.safetensors")
    model.save(directory / "model.zip")
    return model, directory / "model.safetensors", directory / "model.zip"


def assert_restored_exactly(model: IPPO, loaded: IPPO) -> None:
    """Weights, optimizer states, normalization statistics, counters and deterministic actions all equal."""
    assert_same_parameters(parameters(loaded), parameters(model))
    for agent, policy in model.policies.items():
        assert policy.optimizer.state_dict()["state"], "the model has taken optimizer steps"
        assert_same_optimizer_state(loaded.policies[agent].optimizer, policy.optimizer)
    assert model.obs_normalizers is not None and loaded.obs_normalizers is not None
    for agent, normalizer in model.obs_normalizers.items():
        restored = loaded.obs_normalizers[agent]
        np.testing.assert_array_equal(restored.obs_rms.mean, normalizer.obs_rms.mean)
        np.testing.assert_array_equal(restored.obs_rms.var, normalizer.obs_rms.var)
        assert restored.obs_rms.count == normalizer.obs_rms.count and restored.clip_obs == normalizer.clip_obs
    assert model.return_normalizers is not None and loaded.return_normalizers is not None
    for agent, return_normalizer in model.return_normalizers.items():
        saved_rms, restored_rms = return_normalizer.return_rms, loaded.return_normalizers[agent].return_rms
        assert (restored_rms.mean, restored_rms.var, restored_rms.count) == (saved_rms.mean, saved_rms.var, saved_rms.count)
    for name in ("policy_version", "num_timesteps", "stale_episodes_dropped", "rejected_episodes", "_n_updates"):
        assert getattr(loaded, name) == getattr(model, name), name
    names = ("n_episodes", "n_epochs", "max_version_lag", "gamma", "gae_lambda", "learning_rate", "policy_kwargs")
    for name in (*names, "time_limit_bootstrap"):
        assert getattr(loaded, name) == getattr(model, name), name
    assert loaded.observation_spaces == model.observation_spaces and loaded.action_spaces == model.action_spaces
    assert loaded.policy_class is model.policy_class
    assert loaded._agents_seen == model._agents_seen
    assert list(loaded.ep_info_buffer) == list(model.ep_info_buffer)
    observations = observation_batch(model)
    assert_same_actions(
        loaded.predict(observations, deterministic=True)[0], model.predict(observations, deterministic=True)[0]
    )


def test_safetensors_file_restores_the_model_exactly_without_unpickling(trained: tuple[IPPO, pathlib.Path, Any]) -> None:
    model, path, _ = trained
    with no_unpickling() as calls:
        loaded = IPPO.load(path)
    assert calls == []
    assert_restored_exactly(model, loaded)


def test_untrusted_zip_restores_the_model_exactly_with_only_weights_only_torch_loads(
    trained: tuple[IPPO, Any, pathlib.Path],
) -> None:
    model, _, path = trained
    with no_unpickling(allow_torch_weights_only=True) as calls:
        loaded = IPPO.load(path, trusted=False)
    assert calls and set(calls) == {"allowed torch.load(weights_only=True)"}
    assert_restored_exactly(model, loaded)


def test_the_unpickling_guard_catches_a_trusted_zip_load(trained: tuple[IPPO, Any, pathlib.Path]) -> None:
    # The guard can fail: SB3's own zip loading unpickles (with a warning it skips the entry and carries on).
    _, _, path = trained
    with no_unpickling(allow_torch_weights_only=True) as calls, pytest.raises(Unpickled):
        IPPO.load(path, trusted=True)
    assert "cloudpickle.loads" in calls


def test_learning_continues_identically_from_either_format(trained: tuple[IPPO, pathlib.Path, pathlib.Path]) -> None:
    _, safetensors_path, zip_path = trained
    continued = []
    for path in (zip_path, safetensors_path):
        loaded = IPPO.load(path, env=make_vec_env(DyingAgentsEnv, n_envs=2, seed=1))
        loaded.learn(24, reset_num_timesteps=False)
        continued.append(loaded)
    from_zip, from_safetensors = continued
    assert from_safetensors.policy_version == from_zip.policy_version > 0
    assert_same_parameters(parameters(from_safetensors), parameters(from_zip))


def test_an_untrained_model_keeps_its_zero_dimensional_statistics_and_learns_on(tmp_path: pathlib.Path) -> None:
    # Before any update a return normalizer's statistics are 0-d arrays (later updates make them numpy scalars).
    model = IPPO("MlpPolicy", make_vec_env(DyingAgentsEnv, n_envs=2, seed=0), n_episodes=2, n_epochs=2,
                 normalize_returns=True, policy_kwargs=dict(net_arch=[8]), seed=0)
    model.save(tmp_path / "untrained.safetensors")
    loaded = IPPO.load(tmp_path / "untrained.safetensors", env=make_vec_env(DyingAgentsEnv, n_envs=2, seed=1))
    assert loaded.return_normalizers is not None and model.return_normalizers is not None
    for agent, normalizer in model.return_normalizers.items():
        restored = loaded.return_normalizers[agent].return_rms
        assert np.shape(restored.var) == np.shape(normalizer.return_rms.var) == ()
        assert np.shape(restored.mean) == np.shape(normalizer.return_rms.mean) == ()
    loaded.learn(24)
    assert loaded.policy_version > 0


def test_save_format_argument_and_file_objects(trained: tuple[IPPO, Any, Any], tmp_path: pathlib.Path) -> None:
    model, _, _ = trained
    model.save(tmp_path / "model", format="safetensors")
    assert (tmp_path / "model.safetensors").is_file()
    with no_unpickling():
        assert_restored_exactly(model, IPPO.load(tmp_path / "model"))  # "model" means "model.safetensors" here
    buffer = io.BytesIO()
    model.save(buffer, format="safetensors")
    buffer.seek(0)
    with no_unpickling():
        loaded = IPPO.load(buffer)
    assert_restored_exactly(model, loaded)
    with pytest.raises(ValueError, match="contradicts"):
        model.save(tmp_path / "model.zip", format="safetensors")
    with pytest.raises(ValueError, match="format must be"):
        model.save(tmp_path / "model.bin", format="pickle")


def test_safetensors_file_holds_json_metadata_and_named_tensors(trained: tuple[IPPO, pathlib.Path, Any]) -> None:
    model, path, _ = trained
    with safe_open(str(path), framework="pt") as file:
        document = json.loads(file.metadata()["sb3_ippo"])
        names = set(file.keys())
    assert document["policy_class"] == "MlpPolicy"
    assert document["possible_agents"] == model.possible_agents
    assert document["attributes"]["observation_spaces"]["agent_0"] == {
        "__type__": "Box", "low": 0.0, "high": 1.0, "shape": [2], "dtype": "<f4"
    }
    assert "_policies/agent_agent_0.action_net.weight" in names
    assert "_policies.agent_agent_0.optimizer/state/0/exp_avg" in names
    assert "obs_normalizers/agent_0/obs_rms/mean" in names


def malicious_zip(path: pathlib.Path, source: pathlib.Path, marker: pathlib.Path) -> None:
    """A copy of the zip at ``source`` whose pickled ``policy_class`` entry, once unpickled, creates ``marker``."""

    class Touch:
        def __reduce__(self) -> tuple:
            return (pathlib.Path.touch, (marker,))

    def forge(data: dict[str, Any]) -> None:
        data["policy_class"][":serialized:"] = base64.b64encode(pickle.dumps(Touch())).decode()

    edited_zip(path, source, forge)


def test_a_crafted_zip_runs_code_when_trusted_but_not_when_untrusted(
    trained: tuple[IPPO, Any, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    _, _, zip_path = trained
    marker = tmp_path / "pwned"
    malicious_zip(tmp_path / "malicious.zip", zip_path, marker)
    IPPO.load(tmp_path / "malicious.zip", trusted=False)  # the pickled entry is ignored, its JSON twin used
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017 (what fails after the payload ran does not matter)
        IPPO.load(tmp_path / "malicious.zip", trusted=True)
    assert marker.exists(), "the crafted zip runs code on a trusted load: the risk trusted=False removes"


def test_untrusted_load_refuses_a_zip_without_the_json_twin(trained: tuple[IPPO, Any, Any], tmp_path: pathlib.Path) -> None:
    model, _, _ = trained
    BaseAlgorithm.save(model, tmp_path / "plain_sb3.zip")  # SB3's own save: pickles only
    with no_unpickling(allow_torch_weights_only=True), pytest.raises(UntrustedContentError, match="policy_class"):
        IPPO.load(tmp_path / "plain_sb3.zip", trusted=False)


def test_untrusted_load_names_an_entry_that_only_unpickling_restores(tmp_path: pathlib.Path) -> None:
    model = make_model(learning_rate=lambda progress: 3e-4 * progress)
    model.save(tmp_path / "schedule.zip")
    with no_unpickling(allow_torch_weights_only=True), pytest.raises(UntrustedContentError, match="learning_rate"):
        IPPO.load(tmp_path / "schedule.zip", trusted=False)
    assert IPPO.load(tmp_path / "schedule.zip").learning_rate(0.5) == pytest.approx(1.5e-4)


def test_safetensors_refuses_a_callable_schedule_at_save_time(tmp_path: pathlib.Path) -> None:
    model = make_model(learning_rate=lambda progress: 3e-4 * progress)
    with pytest.raises(NotSerializableError, match=r"learning_rate.*LinearSchedule"):
        model.save(tmp_path / "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists()


def test_sb3_schedule_classes_and_allow_listed_policy_kwargs_are_stored(tmp_path: pathlib.Path) -> None:
    policy_kwargs = dict(net_arch=dict(pi=[16], vf=[8]), activation_fn=nn.Tanh, optimizer_class=th.optim.AdamW,
                         optimizer_kwargs=dict(weight_decay=0.01, betas=(0.8, 0.99)))
    model = make_model(learning_rate=LinearSchedule(1e-3, 1e-4, 0.5), clip_range=LinearSchedule(0.3, 0.1, 1.0),
                       policy_kwargs=policy_kwargs)
    model.learn(24)
    model.save(tmp_path / "model.safetensors")
    with no_unpickling():
        loaded = IPPO.load(tmp_path / "model.safetensors")
    assert loaded.policy_kwargs == policy_kwargs
    assert isinstance(loaded.policies["agent_0"].optimizer, th.optim.AdamW)
    for progress in (1.0, 0.7, 0.2):
        assert loaded.lr_schedule(progress) == model.lr_schedule(progress)
        assert loaded.clip_range_schedule(progress) == model.clip_range_schedule(progress)
    assert_same_parameters(parameters(loaded), parameters(model))


class CustomActivation(nn.ReLU):
    pass


def test_safetensors_refuses_a_class_outside_the_allow_list(tmp_path: pathlib.Path) -> None:
    model = make_model(policy_kwargs=dict(net_arch=[16], activation_fn=CustomActivation))
    with pytest.raises(NotSerializableError, match=r"policy_kwargs.*CustomActivation.*allow-list"):
        model.save(tmp_path / "model.safetensors")


def forged_safetensors(path: pathlib.Path, source: pathlib.Path, edit: Any) -> None:
    """A copy of the safetensors file at ``source`` with its JSON document changed by ``edit``."""
    with safe_open(str(source), framework="pt") as file:
        document = json.loads(file.metadata()["sb3_ippo"])
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    edit(document)
    path.write_bytes(save_safetensors_bytes(tensors, metadata={"sb3_ippo": json.dumps(document)}))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda doc: doc["attributes"].update(policy_class={"__type__": "class", "name": "os.system"}), "os.system"),
        (lambda doc: doc["attributes"].update(seed={"__type__": "pickle", "data": "gASV..."}), "unknown type tag 'pickle'"),
        (
            lambda doc: doc["attributes"].update(update_stats={"__type__": "object", "class": "Popen", "state": {}}),
            "Popen",
        ),
    ],
    ids=["class outside the allow-list", "unknown tag", "object of an unknown class"],
)
def test_a_forged_safetensors_file_is_refused(
    trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path, edit: Any, message: str
) -> None:
    _, path, _ = trained
    forged_safetensors(tmp_path / "forged.safetensors", path, edit)
    with no_unpickling(), pytest.raises(UntrustedContentError, match=message):
        IPPO.load(tmp_path / "forged.safetensors")


def test_a_damaged_safetensors_file_is_a_clear_error(
    trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path
) -> None:
    _, path, _ = trained
    truncated_tuple = {"__type__": "tuple"}  # its "items" are missing
    forged_safetensors(tmp_path / "damaged.safetensors", path, lambda doc: doc["attributes"].update(seed=truncated_tuple))
    with pytest.raises(ModelFileError, match=r"damaged\.safetensors.*'seed'.*KeyError"):
        IPPO.load(tmp_path / "damaged.safetensors")


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (3,), np.float32),
        spaces.Box(np.array([0.0, -1.5]), np.array([1.0, 2.5]), dtype=np.float64),
        spaces.Box(0, 255, (8, 8, 3), np.uint8),
        spaces.Discrete(5, start=-2),
        spaces.MultiDiscrete([2, 3, 4], start=[0, 1, -1]),
        spaces.MultiBinary(4),
        spaces.MultiBinary([2, 3]),
        spaces.Dict({"features": spaces.Box(-1.0, 1.0, (2,)), "mode": spaces.Discrete(2)}),
    ],
    ids=repr,
)
def test_spaces_are_described_as_json_and_restored_equal(space: spaces.Space) -> None:
    description = json.loads(json.dumps(encode_space(space)))
    restored = decode_space(description)
    assert restored == space
    assert restored.dtype == space.dtype


def test_a_tuple_space_is_refused_with_the_supported_kinds() -> None:
    with pytest.raises(NotSerializableError, match="Box, Discrete, MultiDiscrete, MultiBinary and Dict"):
        encode_space(spaces.Tuple([spaces.Discrete(2)]))


def test_every_space_kind_round_trips_through_a_model(tmp_path: pathlib.Path) -> None:
    env = HeterogeneousEnv(agents=["discrete", "box", "multi_discrete", "multi_binary"])
    model = make_model(env)
    model.learn(16)
    model.save(tmp_path / "model.safetensors")
    with no_unpickling():
        loaded = IPPO.load(tmp_path / "model.safetensors", env=env)
    assert loaded.action_spaces == model.action_spaces
    assert_same_parameters(parameters(loaded), parameters(model))
    observations = observation_batch(model)
    assert_same_actions(
        loaded.predict(observations, deterministic=True)[0], model.predict(observations, deterministic=True)[0]
    )


def test_tensors_shared_between_policies_are_stored_once(tmp_path: pathlib.Path) -> None:
    # As agent groups will: two agent keys holding one policy object (and so one optimizer).
    model = make_model(DyingAgentsEnv(death_steps={"agent_0": None, "agent_1": None}))
    keys = model._policy_keys
    model._policies[keys["agent_1"]] = model._policies[keys["agent_0"]]
    model.save(tmp_path / "shared.safetensors")
    with safe_open(str(tmp_path / "shared.safetensors"), framework="pt") as file:
        names = list(file.keys())
    n_weights = len(model.policies["agent_0"].state_dict())
    assert len([name for name in names if name.startswith("_policies/")]) == n_weights
    loaded = IPPO.load(tmp_path / "shared.safetensors")
    assert_same_parameters(parameters(loaded), parameters(model))


def test_trusted_zip_loads_keep_no_trace_of_the_json_twin(trained: tuple[IPPO, Any, pathlib.Path]) -> None:
    _, _, zip_path = trained
    with zipfile.ZipFile(zip_path) as archive:
        assert JSON_STATE_KEY in json.loads(archive.read("data"))
    assert not hasattr(IPPO.load(zip_path), JSON_STATE_KEY)


# ----------------------------------------------------------------------------------------------------------------
# Crafted and damaged files: one error type, ModelFileError, that names the file and what is wrong
# ----------------------------------------------------------------------------------------------------------------


@contextmanager
def models_built() -> Iterator[list[IPPO]]:
    """Yields the list of the IPPO instances built meanwhile (``load`` builds one, then fills it from the file)."""
    built: list[IPPO] = []
    real_init = IPPO.__init__

    def init(self: IPPO, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real_init(self, *args, **kwargs)

    IPPO.__init__ = init  # type: ignore[method-assign]
    try:
        yield built
    finally:
        IPPO.__init__ = real_init  # type: ignore[method-assign]


@pytest.mark.parametrize("name", ["predict", "_setup_model", "policies", "__class__"])
def test_a_safe_file_cannot_replace_a_method_or_property_of_the_model(
    trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path, name: str
) -> None:
    _, path, _ = trained
    forged_safetensors(tmp_path / "forged.safetensors", path, lambda doc: doc["attributes"].update({name: 1}))
    with models_built() as built, pytest.raises(ModelFileError, match=rf"forged\.safetensors.*{re.escape(name)}"):
        IPPO.load(tmp_path / "forged.safetensors")
    assert built and all(name not in vars(model) for model in built), "nothing from the file was set"


@pytest.mark.parametrize("name", ["surprise", "_learner", "buffers", "env"])
def test_a_safe_file_cannot_set_an_attribute_the_model_does_not_save(
    trained: tuple[IPPO, pathlib.Path, pathlib.Path], tmp_path: pathlib.Path, name: str
) -> None:
    _, path, zip_path = trained
    forged_safetensors(tmp_path / "forged.safetensors", path, lambda doc: doc["attributes"].update({name: 1}))
    with pytest.raises(ModelFileError, match=rf"forged\.safetensors.*{name}"):
        IPPO.load(tmp_path / "forged.safetensors")
    edited_zip(tmp_path / "forged.zip", zip_path, lambda data: data.update({name: 1}))
    with pytest.raises(ModelFileError, match=rf"forged\.zip.*{name}"):
        IPPO.load(tmp_path / "forged.zip", trusted=False)


def edited_zip(path: pathlib.Path, source: pathlib.Path, edit: Any) -> None:
    """A copy of the zip at ``source`` with its ``data`` entry (the JSON document) changed by ``edit``."""
    with zipfile.ZipFile(source) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    edit(data)
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)


def test_a_trusted_zip_skips_an_attribute_it_does_not_know_with_a_warning(
    trained: tuple[IPPO, Any, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    model, _, zip_path = trained
    edited_zip(tmp_path / "newer.zip", zip_path, lambda data: data.update(attribute_of_a_newer_version=1))
    with pytest.warns(UserWarning, match=r"newer\.zip.*attribute_of_a_newer_version.*ignored"):
        loaded = IPPO.load(tmp_path / "newer.zip")
    assert not hasattr(loaded, "attribute_of_a_newer_version")
    assert_same_parameters(parameters(loaded), parameters(model))


def test_a_trusted_zip_cannot_replace_a_method_of_the_model(
    trained: tuple[IPPO, Any, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    _, _, zip_path = trained
    edited_zip(tmp_path / "shadowing.zip", zip_path, lambda data: data.update(predict=1))
    with pytest.raises(ModelFileError, match=r"shadowing\.zip.*predict"):
        IPPO.load(tmp_path / "shadowing.zip")


def test_a_zip_saved_by_sb3_ippo_0_1_loads_without_a_warning_about_its_attributes() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = IPPO.load("tests/data/ippo_v0_1_dying_agents.zip", env=DyingAgentsEnv())
    assert not [warning for warning in caught if "ignored" in str(warning.message)]
    expected = np.load("tests/data/ippo_v0_1_dying_agents_expected.npz")
    assert loaded.policy_version == int(expected["policy_version"])
    for agent, policy in loaded.policies.items():
        for name, p in policy.named_parameters():
            np.testing.assert_array_equal(p.detach().numpy(), expected[f"{agent}/{name}"])


def _trained_briefly(make: Any) -> IPPO:
    model = make()
    model.learn(48)
    return model


@pytest.mark.parametrize(
    "make",
    [
        lambda: make_model(make_vec_env(DyingAgentsEnv, n_envs=2, seed=0), normalize_obs=True),
        lambda: make_model(simple_adversary_v3.parallel_env(N=3, max_cycles=5), share_parameters={"agent": True},
                           groups={"agent": ["agent_0", "agent_1"]}, group_kwargs={"agent": dict(learning_rate=1e-3)}),
        lambda: make_model(tictactoe(n_envs=2), opponents={P2: "random"}),
        lambda: make_model(tictactoe(n_envs=2), share_parameters=True, self_play_pool=dict(snapshot_every=1, size=2)),
        lambda: make_model(DyingAgentsEnv(), async_training=True),
    ],
    ids=["normalize_obs", "groups", "opponents", "self_play_pool", "async_training"],
)
def test_every_attribute_a_trained_model_saves_is_restored_by_a_safe_load(make: Any, tmp_path: pathlib.Path) -> None:
    model = _trained_briefly(make)
    model.save(tmp_path / "model.safetensors")
    loaded = IPPO.load(tmp_path / "model.safetensors")
    saved = serialization.save_data(model)
    assert set(serialization.save_data(loaded)) == set(saved)
    for name in ("policy_version", "num_timesteps", "possible_agents", "_policy_keys", "group_definition"):
        assert getattr(loaded, name) == getattr(model, name), name


@pytest.mark.parametrize("suffix", ["safetensors", "zip"])
@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty"])
@pytest.mark.parametrize("trusted", [True, False])
def test_a_truncated_or_garbled_file_is_a_model_file_error_naming_it(
    trained: tuple[IPPO, pathlib.Path, pathlib.Path], tmp_path: pathlib.Path, suffix: str, damage: str, trusted: bool
) -> None:
    _, safetensors_path, zip_path = trained
    content = (safetensors_path if suffix == "safetensors" else zip_path).read_bytes()
    damaged = {
        "truncated": content[: len(content) // 2],
        "garbled": bytes(np.random.default_rng(0).integers(0, 256, len(content), dtype=np.uint8)),
        "empty": b"",
    }[damage]
    path = tmp_path / f"damaged_model.{suffix}"
    path.write_bytes(damaged)
    with pytest.raises(ModelFileError, match=r"damaged_model\." + suffix):
        IPPO.load(path, trusted=trusted)


@pytest.mark.parametrize("kept", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("trusted", [True, False])
def test_a_zip_cut_short_is_reported_as_truncated_not_as_another_kind_of_file(
    trained: tuple[IPPO, pathlib.Path, pathlib.Path], tmp_path: pathlib.Path, kept: float, trusted: bool
) -> None:
    # Past about half, the bytes left hold a whole zip of their own: a weights file (torch saves zips).
    content = trained[2].read_bytes()
    path = tmp_path / "cut_model.zip"
    path.write_bytes(content[: int(len(content) * kept)])
    with pytest.raises(ModelFileError, match=r"cut_model\.zip is a damaged zip, cut short: .*a truncated file"):
        IPPO.load(path, trusted=trusted)


def _set(document: dict, keys: tuple, value: Any) -> None:
    for key in keys[:-1]:
        document = document[key]
    document[keys[-1]] = value


def _delete(document: dict, keys: tuple) -> None:
    for key in keys[:-1]:
        document = document[key]
    del document[keys[-1]]


BIAS = {"__type__": "tensor", "name": "_policies/agent_agent_0.action_net.bias"}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda doc: _delete(doc, ("attributes", "possible_agents")), "possible_agents"),
        (lambda doc: _delete(doc, ("parameters", "_policies")), "_policies"),
        (lambda doc: _delete(doc, ("parameters", "_policies", "agent_agent_0.action_net.weight")),
         "agent_agent_0.action_net.weight"),
        (lambda doc: _delete(doc, ("parameters", "_policies.agent_agent_1.optimizer")), "_policies.agent_agent_1.optimizer"),
        (lambda doc: _set(doc, ("parameters", "_policies", "agent_agent_0.action_net.weight"), BIAS),
         r"agent_agent_0.action_net.weight.*shape"),
        (lambda doc: _set(doc, ("parameters", "_policies.agent_agent_0.optimizer", "state", "items", 0, 1, "exp_avg"), BIAS),
         r"_policies.agent_agent_0.optimizer.*exp_avg.*shape"),
        (lambda doc: _set(doc, ("attributes",), []), "attributes"),
        (lambda doc: _set(doc, ("parameters",), "weights"), "parameters"),
        (lambda doc: _set(doc, ("attributes", "possible_agents"), 3), "possible_agents"),
        (lambda doc: _set(doc, ("attributes", "observation_spaces"), {"agent_0": 1}), "observation_spaces"),
        (lambda doc: _set(doc, ("attributes", "n_epochs"), "many"), "n_epochs"),
        (lambda doc: _set(doc, ("attributes", "policy_kwargs"), [16]), "policy_kwargs"),
        (lambda doc: doc["attributes"]["possible_agents"].append("ghost"), "ghost"),
        (lambda doc: _set(doc, ("parameters", "_policies", "agent_agent_0.action_net.bias"), {"__type__": "pickle"}),
         "unknown type tag 'pickle'"),
    ],
    ids=[
        "possible_agents missing", "_policies missing", "a weight missing", "an optimizer missing",
        "a weight of the wrong shape", "an optimizer state of the wrong shape", "attributes not a dict",
        "parameters not a dict", "possible_agents not a list", "a space not a space", "n_epochs not a number",
        "policy_kwargs not a dict", "an agent without spaces", "an unknown tag",
    ],
)
def test_a_crafted_or_damaged_document_is_a_model_file_error_naming_the_entry(
    trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path, edit: Any, message: str
) -> None:
    _, path, _ = trained
    forged_safetensors(tmp_path / "crafted.safetensors", path, edit)
    with pytest.raises(ModelFileError, match=r"crafted\.safetensors(.|\n)*" + message):
        IPPO.load(tmp_path / "crafted.safetensors")


@contextmanager
def no_large_allocation(limit: int = 1_000_000) -> Iterator[None]:
    """Make gymnasium's Box refuse to be built with more than ``limit`` elements (so no test allocates one)."""
    real_init = spaces.Box.__init__

    def init(self: spaces.Box, low: Any, high: Any, shape: Any = None, *args: Any, **kwargs: Any) -> None:
        size = np.prod(shape if shape is not None else np.shape(low), dtype=object)
        assert size <= limit, f"a Box of {size} elements was built"
        real_init(self, low, high, shape, *args, **kwargs)

    spaces.Box.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        spaces.Box.__init__ = real_init  # type: ignore[method-assign]


def test_a_huge_declared_box_is_refused_before_anything_is_allocated(
    trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path
) -> None:
    _, path, _ = trained
    huge = {"__type__": "Box", "low": 0.0, "high": 1.0, "shape": [2**20, 2**20], "dtype": "<f4"}
    forged_safetensors(tmp_path / "huge.safetensors", path,
                       lambda doc: doc["attributes"]["observation_spaces"].update(agent_0=huge))
    start = time.perf_counter()
    message = r"huge\.safetensors.*observation_spaces/agent_0.*MAX_SPACE_ELEMENTS"
    with no_large_allocation(), pytest.raises(ModelFileError, match=message):
        IPPO.load(tmp_path / "huge.safetensors")
    assert time.perf_counter() - start < 5.0


def test_declared_sizes_add_up_over_the_whole_file(trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path) -> None:
    _, path, _ = trained
    n_spaces = MAX_FILE_ELEMENTS // MAX_SPACE_ELEMENTS + 1
    large = {"__type__": "Box", "low": 0.0, "high": 1.0, "shape": [MAX_SPACE_ELEMENTS], "dtype": "|u1"}
    forged_safetensors(tmp_path / "many.safetensors", path,
                       lambda doc: doc["attributes"].update(observation_spaces={f"a{i}": large for i in range(n_spaces)}))
    with no_large_allocation(), pytest.raises(ModelFileError, match=r"many\.safetensors.*MAX_FILE_ELEMENTS"):
        IPPO.load(tmp_path / "many.safetensors")


@pytest.mark.parametrize(
    "description",
    [
        {"__type__": "Box", "low": 0.0, "high": 1.0, "shape": [2**62], "dtype": "<f4"},
        {"__type__": "Box", "low": 0.0, "high": 1.0, "shape": [-1, 2], "dtype": "<f4"},
        {"__type__": "Box", "low": 0.0, "high": 1.0, "shape": "64", "dtype": "<f4"},
        {"__type__": "Discrete", "n": 2**40, "start": 0, "dtype": "<i8"},
        {"__type__": "MultiDiscrete", "nvec": [2**40, 2], "start": [0, 0], "dtype": "<i8"},
        {"__type__": "MultiBinary", "n": [2**20, 2**20]},
        {"__type__": "DictSpace", "items": [["image", {"__type__": "Box", "high": 1.0, "shape": [1], "dtype": "<f4", "low": {
            "__type__": "ndarray", "dtype": "<f4", "shape": [2**40], "data": [0.0]}}]]},
    ],
    ids=["Box shape", "Box negative shape", "Box shape not a list", "Discrete n", "MultiDiscrete nvec", "MultiBinary n",
         "inline array in a Dict"],
)
def test_a_space_description_over_the_limits_is_refused_before_allocation(description: dict) -> None:
    with no_large_allocation(), pytest.raises(ModelFileError, match="space"):
        decode_space(description)


def test_a_huge_deque_maxlen_is_refused(trained: tuple[IPPO, pathlib.Path, Any], tmp_path: pathlib.Path) -> None:
    _, path, _ = trained
    forged_safetensors(tmp_path / "deque.safetensors", path,
                       lambda doc: doc["attributes"]["ep_info_buffer"].update(maxlen=2**62))
    with pytest.raises(ModelFileError, match=r"deque\.safetensors.*ep_info_buffer.*maxlen"):
        IPPO.load(tmp_path / "deque.safetensors")
