"""The safe encoding: JSON plus tensors, with tagged dicts (``{"__type__": ...}``) for what JSON has no type for.

It can name only allow-listed types: gymnasium spaces (:func:`encode_space`), the classes of :data:`ALLOWED_CLASSES`
and the state-holding classes of :data:`STATE_CLASSES`; decoding refuses anything else.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.torch_layers import CombinedExtractor, FlattenExtractor, NatureCNN
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule
from torch import nn

from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.update.recurrent import RECURRENT_POLICY_ALIASES
from sb3_ippo.serialization.errors import _DAMAGE_ERRORS, ModelFileError, NotSerializableError, UntrustedContentError
from sb3_ippo.serialization.sizes import check_declared_sizes
from sb3_ippo.update.ppo import UpdateStats

# Classes a file may name, by the name it uses. The policy aliases come first, so that a file says "MlpPolicy".
POLICY_CLASSES: dict[str, type] = {
    "MlpPolicy": ActorCriticPolicy,
    "CnnPolicy": ActorCriticCnnPolicy,
    "MultiInputPolicy": MultiInputActorCriticPolicy,
    **RECURRENT_POLICY_ALIASES,
}
_OTHER_ALLOWED_CLASSES: list[type] = [
    # activation_fn
    nn.ReLU,
    nn.Tanh,
    nn.ELU,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Softplus,
    nn.Mish,
    nn.SELU,
    nn.Identity,
    # features_extractor_class
    FlattenExtractor,
    NatureCNN,
    CombinedExtractor,
    # optimizer_class
    th.optim.Adam,
    th.optim.AdamW,
    th.optim.SGD,
    th.optim.RMSprop,
    RMSpropTFLike,
]
ALLOWED_CLASSES: dict[str, type] = {
    **POLICY_CLASSES,
    **{f"{cls.__module__}.{cls.__qualname__}": cls for cls in _OTHER_ALLOWED_CLASSES},
}
_CLASS_NAMES: dict[type, str] = {}
for _name, _cls in ALLOWED_CLASSES.items():
    _CLASS_NAMES.setdefault(_cls, _name)


def allow_class(cls: type) -> None:
    """Add ``cls`` to :data:`ALLOWED_CLASSES`, by its class path: the module of an algorithm's own policy classes
    calls it (MAPPO's ``CentralCriticPolicy``), so that this package imports nothing of the algorithms."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    ALLOWED_CLASSES[name] = cls
    _CLASS_NAMES.setdefault(cls, name)

# Objects stored as their attribute dict and restored with `cls.__new__` plus that dict (no constructor runs).
STATE_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        RunningMeanStd,
        ObservationNormalizer,
        ReturnNormalizer,
        UpdateStats,
        ConstantSchedule,
        LinearSchedule,
        FloatSchedule,
    )
}

_NUMERIC_DTYPE_KINDS = "biuf"
# numpy dtypes stored as safetensors tensors; arrays of other numeric dtypes are written inline in the JSON.
_TENSOR_DTYPES = tuple(
    np.dtype(name) for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
)


def _storage_key(tensor: th.Tensor) -> tuple:
    return (
        tensor.device.type,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


class _Encoder:
    """Encodes values as JSON; tensors (and numpy arrays, when ``tensors`` is given) go to ``tensors``.

    :param tensors: Where tensors are stored, by name (their path in the document). None: no tensor may occur,
        and numpy arrays are written inline as JSON lists (exact: floats are written with ``repr`` precision).
    """

    def __init__(self, tensors: dict[str, th.Tensor] | None) -> None:
        self.tensors = tensors
        self._names: dict[tuple, str] = {}
        # The tensors whose memory addresses name them in `_names`: kept alive, so that no address is reused.
        self._sources: list[th.Tensor] = []

    def encode(self, value: Any, path: str) -> Any:
        if isinstance(value, np.generic):  # before the primitives: np.float64 is a float, but computes differently
            return {"__type__": "numpy_scalar", "dtype": _numeric_dtype(value.dtype, path), "value": value.item()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, th.Tensor):
            return self._tensor(value, path)
        if isinstance(value, np.ndarray):
            return self._array(value, path)
        if isinstance(value, tuple):
            return {"__type__": "tuple", "items": [self.encode(item, f"{path}/{i}") for i, item in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(item, f"{path}/{i}") for i, item in enumerate(value)]
        if isinstance(value, deque):
            items = [self.encode(item, f"{path}/{i}") for i, item in enumerate(value)]
            return {"__type__": "deque", "items": items, "maxlen": value.maxlen}
        if isinstance(value, (set, frozenset)):
            items = sorted(value, key=repr)
            return {"__type__": "set", "items": [self.encode(item, f"{path}/{i}") for i, item in enumerate(items)]}
        if isinstance(value, dict):
            return self._dict(value, path)
        if isinstance(value, spaces.Space):
            return encode_space(value, path)
        if isinstance(value, type):
            return {"__type__": "class", "name": class_name(value, path)}
        if type(value).__name__ in STATE_CLASSES and STATE_CLASSES[type(value).__name__] is type(value):
            return {"__type__": "object", "class": type(value).__name__, "state": self._dict(vars(value), path)}
        raise NotSerializableError(
            f"{path} is a {type(value).__module__}.{type(value).__qualname__} ({value!r:.80}), which the safe format "
            "cannot describe: it stores tensors, JSON values, gymnasium spaces, SB3's schedule classes "
            "(ConstantSchedule, LinearSchedule) and the allow-listed classes of sb3_ippo.serialization.ALLOWED_CLASSES"
        )

    def _dict(self, value: Mapping, path: str) -> Any:
        if all(isinstance(key, str) for key in value) and "__type__" not in value:
            return {key: self.encode(item, f"{path}/{key}") for key, item in value.items()}
        return {
            "__type__": "dict",
            "items": [[self.encode(key, path), self.encode(item, f"{path}/{key}")] for key, item in value.items()],
        }

    def _tensor(self, tensor: th.Tensor, path: str) -> dict[str, Any]:
        if self.tensors is None:
            raise NotSerializableError(f"{path} is a tensor, which this part of the file cannot hold")
        key = _storage_key(tensor)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = path
            self._sources.append(tensor)
            # A copy: safetensors refuses tensors that share memory, and wants them contiguous and on the CPU.
            self.tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
        return {"__type__": "tensor", "name": name}

    def _array(self, array: np.ndarray, path: str) -> dict[str, Any]:
        dtype = _numeric_dtype(array.dtype, path)
        if self.tensors is not None and array.dtype.newbyteorder("=") == array.dtype and array.dtype in _TENSOR_DTYPES:
            # Not np.ascontiguousarray, which makes a 0-d array (a RunningMeanStd's var of scalar returns) 1-d.
            tensor = th.from_numpy(array if array.flags["C_CONTIGUOUS"] else array.copy(order="C"))
            return {"__type__": "ndarray", "dtype": dtype, "tensor": self._tensor(tensor, path)["name"]}
        return {"__type__": "ndarray", "dtype": dtype, "shape": list(array.shape), "data": array.reshape(-1).tolist()}


def _numeric_dtype(dtype: np.dtype, path: str) -> str:
    if dtype.kind not in _NUMERIC_DTYPE_KINDS:
        raise NotSerializableError(f"{path} has the numpy dtype {dtype}; only bool, integer and float arrays are stored")
    return dtype.str


def class_name(cls: type, path: str = "class") -> str:
    """The allow-listed name of ``cls``.

    :raises NotSerializableError: for a class outside :data:`ALLOWED_CLASSES`.
    """
    name = _CLASS_NAMES.get(cls)
    if name is None:
        raise NotSerializableError(
            f"{path} is the class {cls.__module__}.{cls.__qualname__}, which is not in the allow-list of classes a safe "
            f"model file may name: {sorted(ALLOWED_CLASSES)}"
        )
    return name


def encode_space(space: spaces.Space, path: str = "space") -> dict[str, Any]:
    """Describe a gymnasium space (Box, Discrete, MultiDiscrete, MultiBinary, or a Dict of those) as JSON."""
    inline = _Encoder(None)
    if isinstance(space, spaces.Box):

        def bound(values: np.ndarray) -> Any:
            # One number for uniform bounds (images: 0 and 255), else every value.
            flat = np.asarray(values).reshape(-1)
            return flat[0].item() if flat.size and np.all(flat == flat[0]) else inline.encode(np.asarray(values), path)

        return {
            "__type__": "Box",
            "low": bound(space.low),
            "high": bound(space.high),
            "shape": list(space.shape),
            "dtype": _numeric_dtype(space.dtype, path),  # type: ignore[arg-type]
        }
    if isinstance(space, spaces.Discrete):
        return {"__type__": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": space.dtype.str}  # type: ignore[union-attr]
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "__type__": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": space.dtype.str,  # type: ignore[union-attr]
        }
    if isinstance(space, spaces.MultiBinary):
        return {"__type__": "MultiBinary", "n": space.n if isinstance(space.n, int) else list(space.n)}
    if isinstance(space, spaces.Dict):
        items = [[key, encode_space(sub, f"{path}/{key}")] for key, sub in space.spaces.items()]
        return {"__type__": "DictSpace", "items": items}
    raise NotSerializableError(
        f"{path} is the space {space}; the safe format describes Box, Discrete, MultiDiscrete, MultiBinary and Dict spaces"
    )


class _Decoder:
    """Decodes what :class:`_Encoder` wrote. Only the tags below exist; anything else is refused.

    Call :func:`~sb3_ippo.serialization.sizes.check_declared_sizes` on a document before decoding it: the decoder
    trusts the sizes it was checked for.
    """

    def __init__(self, tensors: Mapping[str, th.Tensor] | None) -> None:
        self.tensors = tensors

    def decode(self, value: Any, path: str) -> Any:
        if isinstance(value, list):
            return [self.decode(item, f"{path}/{i}") for i, item in enumerate(value)]
        if not isinstance(value, dict):
            return value
        tag = value.get("__type__")
        if tag is None:
            return {key: self.decode(item, f"{path}/{key}") for key, item in value.items()}
        if tag == "tensor":
            return self._tensor(value["name"], path)
        if tag == "ndarray":
            dtype = _checked_dtype(value["dtype"], path)
            if "tensor" in value:
                return self._tensor(value["tensor"], path).numpy().astype(dtype, copy=False)
            return np.asarray(value["data"], dtype=dtype).reshape(value["shape"])
        if tag == "numpy_scalar":
            return _checked_dtype(value["dtype"], path).type(value["value"])
        if tag == "tuple":
            return tuple(self.decode(value["items"], path))
        if tag == "deque":
            return deque(self.decode(value["items"], path), maxlen=value["maxlen"])
        if tag == "set":
            return set(self.decode(value["items"], path))
        if tag == "dict":
            return {self.decode(key, path): self.decode(item, f"{path}/{key}") for key, item in value["items"]}
        if tag == "class":
            return _allowed_class(value["name"], path)
        if tag == "object":
            return self._object(value, path)
        if tag in _SPACE_TAGS:
            return _decode_space(value, path)
        raise UntrustedContentError(f"{path} has the unknown type tag {tag!r}")

    def _tensor(self, name: str, path: str) -> th.Tensor:
        if self.tensors is None or not isinstance(name, str) or name not in self.tensors:
            raise UntrustedContentError(f"{path} refers to the tensor {name!r}, which the file does not hold")
        return self.tensors[name]

    def _object(self, value: Mapping[str, Any], path: str) -> Any:
        cls = STATE_CLASSES.get(value["class"])
        if cls is None:
            raise UntrustedContentError(f"{path} names the class {value['class']!r}, which a safe model file may not hold")
        state = self.decode(value["state"], path)
        if not isinstance(state, dict):
            raise ModelFileError(f"{path}: the state of a {cls.__name__} is a {type(state).__name__}, not a dict")
        # The state is instance data: a name the class defines (a method such as RunningMeanStd.update) is not.
        shadowing = sorted(str(name) for name in state if not isinstance(name, str) or _is_class_attribute(cls, name))
        if shadowing:
            raise ModelFileError(f"{path}: the state of a {cls.__name__} sets {shadowing}, which are not its data")
        obj: Any = object.__new__(cls)
        obj.__dict__.update(state)
        return obj


def _is_class_attribute(cls: type, name: str) -> bool:
    """Whether ``name`` is defined by ``cls`` or a base (a method, property, class variable): an instance attribute
    of that name would shadow it."""
    return any(name in vars(klass) for klass in cls.__mro__)


def _checked_dtype(name: str, path: str) -> np.dtype:
    if not isinstance(name, str):
        raise ModelFileError(f"{path} has the dtype {name!r}, not a numpy dtype name")
    dtype = np.dtype(name)
    if dtype.kind not in _NUMERIC_DTYPE_KINDS:
        raise UntrustedContentError(f"{path} has the dtype {name!r}; a safe model file holds numeric arrays only")
    return dtype


def _allowed_class(name: str, path: str) -> type:
    cls = ALLOWED_CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UntrustedContentError(
            f"{path} names the class {name!r}, which is not in the allow-list of classes a safe model file may name"
        )
    return cls


_SPACE_TAGS = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "DictSpace")


def decode_space(description: Mapping[str, Any], path: str = "space") -> spaces.Space:
    """The gymnasium space that :func:`encode_space` described.

    :raises ModelFileError: for a description that is malformed, or declares a size over
        :data:`~sb3_ippo.serialization.sizes.MAX_SPACE_ELEMENTS` (checked before anything is built).
    """
    check_declared_sizes({path: description})
    try:
        return _decode_space(description, path)
    except ModelFileError:
        raise
    except _DAMAGE_ERRORS as error:
        raise ModelFileError(f"{path} is not a valid space description: {type(error).__name__}: {error}") from error


def _decode_space(description: Mapping[str, Any], path: str) -> spaces.Space:
    tag = description["__type__"]
    inline = _Decoder(None)
    if tag == "Box":
        dtype = _checked_dtype(description["dtype"], path)
        shape = tuple(description["shape"])
        low, high = (
            np.broadcast_to(np.asarray(inline.decode(description[bound], path), dtype=dtype), shape)
            for bound in ("low", "high")
        )
        return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)  # type: ignore[arg-type]
    if tag == "Discrete":
        return spaces.Discrete(description["n"], start=description["start"], dtype=_checked_dtype(description["dtype"], path))  # type: ignore[arg-type]
    if tag == "MultiDiscrete":
        return spaces.MultiDiscrete(
            description["nvec"], dtype=_checked_dtype(description["dtype"], path), start=description["start"]  # type: ignore[arg-type]
        )
    if tag == "MultiBinary":
        return spaces.MultiBinary(description["n"])
    if tag == "DictSpace":
        return spaces.Dict({key: _decode_space(sub, f"{path}/{key}") for key, sub in description["items"]})
    raise UntrustedContentError(f"{path} describes an unknown space type {tag!r}")
