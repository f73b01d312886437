"""Model files that load without running code: a safetensors format, and a JSON twin of the zip's pickled entries.

SB3's zip format stores every attribute that JSON cannot hold (spaces, schedules, the policy class, the
normalization statistics, ...) as a cloudpickle, and unpickling runs whatever code the file names: a model file
from an untrusted source can run any command when it is loaded. This module gives two ways out:

- **The safetensors format** (``model.save("m.safetensors")``): one file written with the ``safetensors`` library.
  Every tensor (each policy's weights, its optimizer's state, the normalization statistics) is a safetensors
  tensor; everything else is JSON in the file's metadata. Non-JSON values are described by a small tagged
  encoding that can only name allow-listed types: gymnasium spaces (Box, Discrete, MultiDiscrete, MultiBinary,
  Dict), SB3's schedule classes, the policy, activation, features extractor and optimizer classes of
  :data:`ALLOWED_CLASSES`, and the few state-holding classes of :data:`STATE_CLASSES` (restored with
  ``__new__`` and their attribute dict, no constructor run). Anything else is refused when saving, with an error
  that names the attribute. Loading decodes JSON and tensors only: nothing is unpickled and no code named by the
  file runs.
- **``IPPO.load(path, trusted=False)`` for zips**: ``save`` writes into the zip's ``data`` entry, beside SB3's
  cloudpickled entries, their description in the same encoding (:data:`JSON_STATE_KEY`). An untrusted load reads
  ``data`` with ``json`` only, takes every pickled entry's value from that description, and refuses (naming it) any
  pickled entry that has none. The weight files (``*.pth``) are read with ``torch.load(weights_only=True)``, torch's
  restricted unpickler that builds tensors and plain containers only.

The file's parameters are whatever the model's ``_get_torch_save_params`` names (state dicts of modules and
optimizers), stored under those names: policies shared by several agents (one module under one key, with
``policy_keys`` mapping several agent ids to it) are stored once, and tensors that share memory are stored once
and aliased.
"""

from __future__ import annotations

import io
import json
import math
import pathlib
import pickle
import warnings
import zipfile
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import stable_baselines3 as sb3
import torch as th
from gymnasium import spaces
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.save_util import is_json_serializable, load_from_zip_file, open_path, save_to_zip_file
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.torch_layers import CombinedExtractor, FlattenExtractor, NatureCNN
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule
from torch import nn

from sb3_ippo.ippo.checks import check_env_matches
from sb3_ippo.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.update.ppo import UpdateStats

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

FORMAT_NAME = "sb3_ippo"
FORMAT_VERSION = 1
# The key of the safetensors metadata entry that holds the JSON document.
METADATA_KEY = "sb3_ippo"
# The key, in a zip's `data` entry, of the JSON description of the entries SB3 pickled.
JSON_STATE_KEY = "_sb3_ippo_json_state"

# The largest size a file may declare for one space, and for all its spaces and inline arrays together, checked before
# anything is built: a few bytes of JSON can declare a Box that gymnasium would fill with a terabyte. A space's size
# is what SB3 allocates for it: the elements of a Box or MultiBinary (and of an inline array), n of a Discrete, the
# sum of a MultiDiscrete's nvec (the width of its one-hot input or action layer); a Dict adds up its members.
# 2**24 elements hold an image of 2048 x 2048 x 4; a file holds each space about twice (per agent, and the Dict of all).
MAX_SPACE_ELEMENTS = 2**24
MAX_FILE_ELEMENTS = 2**26

PathOrFile = str | pathlib.Path | io.BufferedIOBase

# Classes a file may name, by the name it uses. The policy aliases come first, so that a file says "MlpPolicy".
POLICY_CLASSES: dict[str, type] = {
    "MlpPolicy": ActorCriticPolicy,
    "CnnPolicy": ActorCriticCnnPolicy,
    "MultiInputPolicy": MultiInputActorCriticPolicy,
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


class NotSerializableError(ValueError):
    """A value the safe encoding cannot describe (arbitrary callables, classes outside the allow-list, ...)."""


class ModelFileError(ValueError):
    """A model file that is damaged, truncated, or crafted: not a zip or safetensors file, an entry missing or of the
    wrong type or shape, a declared size over the limits (:data:`MAX_SPACE_ELEMENTS`), an attribute the model does not
    save. The message names the file and what is wrong."""


class UntrustedContentError(ModelFileError):
    """A model file holds something that only unpickling could restore, or that the safe decoding does not know."""


# ----------------------------------------------------------------------------------------------------------------
# The encoding: JSON plus tensors, with tagged dicts ({"__type__": ...}) for what JSON has no type for
# ----------------------------------------------------------------------------------------------------------------


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

    Call :func:`check_declared_sizes` on a document before decoding it: the decoder trusts the sizes it was checked for.
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


# ----------------------------------------------------------------------------------------------------------------
# Declared sizes, checked before anything is built
# ----------------------------------------------------------------------------------------------------------------


def _count(value: Any, path: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_SPACE_ELEMENTS:
        raise ModelFileError(
            f"{path} is {value!r:.80}: expected an integer from {minimum} to {MAX_SPACE_ELEMENTS} "
            "(sb3_ippo.serialization.MAX_SPACE_ELEMENTS)"
        )
    return value


def _shape_size(shape: Any, path: str) -> int:
    if not isinstance(shape, list) or len(shape) > 32:  # numpy's limit on dimensions
        raise ModelFileError(f"{path} is {shape!r:.80}: expected a shape, a list of at most 32 integers")
    size = math.prod(_count(dimension, f"{path}/{i}") for i, dimension in enumerate(shape))
    if size > MAX_SPACE_ELEMENTS:
        raise ModelFileError(
            f"{path} declares {shape} ({size} elements), more than sb3_ippo.serialization.MAX_SPACE_ELEMENTS "
            f"({MAX_SPACE_ELEMENTS})"
        )
    return size


def _flat_integers(values: Any, path: str) -> list[int]:
    if isinstance(values, int):
        return [values]
    flat: list[int] = []
    pending = [values]
    while pending:
        value = pending.pop()
        if isinstance(value, list) and len(flat) + len(pending) + len(value) <= MAX_SPACE_ELEMENTS:
            pending.extend(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            flat.append(value)
        else:
            raise ModelFileError(f"{path} is not a (nested) list of at most {MAX_SPACE_ELEMENTS} integers")
    return flat


def _declared_size(description: Mapping[str, Any], path: str) -> int:
    """The size that a tagged description declares (0 for tags that allocate nothing by their declaration).

    :raises ModelFileError: for a malformed size, or one over :data:`MAX_SPACE_ELEMENTS`.
    """
    tag = description.get("__type__")
    if tag == "Box":
        return _shape_size(description.get("shape"), f"{path}/shape")
    if tag == "Discrete":
        return _count(description.get("n"), f"{path}/n", minimum=1)
    if tag == "MultiDiscrete":
        nvec = _flat_integers(description.get("nvec"), f"{path}/nvec")
        if min(nvec, default=1) < 1:
            raise ModelFileError(f"{path}/nvec holds {min(nvec)}: expected positive integers")
        return _count(sum(nvec), f"{path}/nvec (its sum)")
    if tag == "MultiBinary":
        n = description.get("n")
        return _shape_size([n] if isinstance(n, int) else n, f"{path}/n")
    if tag == "ndarray" and "tensor" not in description:  # a tensor's size is that of the file's bytes
        return _shape_size(description.get("shape"), f"{path}/shape")
    if tag == "deque" and description.get("maxlen") is not None:
        _count(description.get("maxlen"), f"{path}/maxlen")
    return 0


class _SizeCheck:
    """Adds up the sizes declared in a document, checking each (:data:`MAX_SPACE_ELEMENTS`) and their total
    (:data:`MAX_FILE_ELEMENTS`). Iterative: a deeply nested document is no deeper a stack."""

    def __init__(self) -> None:
        self.total = 0

    def walk(self, document: Any, path: str) -> None:
        pending = [(document, path)]
        while pending:
            value, where = pending.pop()
            if isinstance(value, list):
                pending.extend((item, f"{where}/{i}") for i, item in enumerate(value))
            elif isinstance(value, dict):
                self.total += _declared_size(value, where)
                if self.total > MAX_FILE_ELEMENTS:
                    raise ModelFileError(
                        f"{where}: the file declares spaces and arrays of more than sb3_ippo.serialization."
                        f"MAX_FILE_ELEMENTS ({MAX_FILE_ELEMENTS}) elements in all"
                    )
                pending.extend((item, f"{where}/{key}") for key, item in value.items())


def check_declared_sizes(entries: Mapping[str, Any]) -> None:
    """Check the sizes that the encoded ``entries`` (by name) declare, before any is decoded.

    :raises ModelFileError: naming the entry whose size is malformed or over :data:`MAX_SPACE_ELEMENTS`, or where the
        total passes :data:`MAX_FILE_ELEMENTS`.
    """
    check = _SizeCheck()
    for name, value in entries.items():
        check.walk(value, name)


def decode_space(description: Mapping[str, Any], path: str = "space") -> spaces.Space:
    """The gymnasium space that :func:`encode_space` described.

    :raises ModelFileError: for a description that is malformed, or declares a size over :data:`MAX_SPACE_ELEMENTS`
        (checked before anything is built).
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


# ----------------------------------------------------------------------------------------------------------------
# What a model saves
# ----------------------------------------------------------------------------------------------------------------


def save_data(model: BaseAlgorithm, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None) -> dict:
    """The attributes ``BaseAlgorithm.save`` writes to a zip's ``data`` entry (the same selection, by the same rules)."""
    data = model.__dict__.copy()
    excluded = set(exclude or []).union(model._excluded_save_params())
    if include is not None:
        excluded = excluded.difference(include)
    state_dict_names, torch_variable_names = model._get_torch_save_params()
    for name in state_dict_names + torch_variable_names:
        excluded.add(name.split(".")[0])
    for name in excluded:
        data.pop(name, None)
    return data


def _advice(name: str) -> str:
    if name in ("learning_rate", "clip_range", "clip_range_vf", "lr_schedule"):
        return (
            "A callable schedule is code, which a safetensors file does not hold: use a constant, or SB3's "
            "LinearSchedule / ConstantSchedule (stable_baselines3.common.utils), or save as .zip (pickled: load it only "
            "from a trusted source)."
        )
    if name == "policy_kwargs":
        return (
            "policy_kwargs may hold JSON values and the allow-listed classes (activation_fn, features_extractor_class, "
            "optimizer_class) of sb3_ippo.serialization.ALLOWED_CLASSES; save as .zip for anything else (pickled: load "
            "it only from a trusted source)."
        )
    if name == "policy_class":
        return f"The safe format names only the policies {list(POLICY_CLASSES)}; save as .zip for a custom policy class."
    return "Save as .zip instead (pickled: load it only from a trusted source)."


def _encode_attributes(
    data: Mapping[str, Any], encoder: _Encoder, advice: bool = True
) -> tuple[dict[str, Any], dict[str, str]]:
    encoded, refused = {}, {}
    for name, value in data.items():
        try:
            encoded[name] = encoder.encode(value, name)
        except NotSerializableError as error:
            refused[name] = f"{error}. {_advice(name)}" if advice else str(error)
    return encoded, refused


def json_state(data: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON twin of the entries of ``data`` that SB3's zip stores pickled: their safe description, or, for those
    that have none (a callable schedule, a custom class), why not. Written into the zip for ``trusted=False`` loads."""
    pickled = {name: value for name, value in data.items() if not is_json_serializable(value)}
    attributes, refused = _encode_attributes(pickled, _Encoder(None), advice=False)
    return {"format_version": FORMAT_VERSION, "attributes": attributes, "refused": refused}


def save_zip(
    model: BaseAlgorithm, path: PathOrFile, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None
) -> None:
    """``BaseAlgorithm.save``, with the JSON twin of the pickled entries added to ``data`` (key :data:`JSON_STATE_KEY`)."""
    data = save_data(model, exclude, include)
    data[JSON_STATE_KEY] = json_state(data)
    _, torch_variable_names = model._get_torch_save_params()
    pytorch_variables = {name: _recursive_getattr(model, name) for name in torch_variable_names}
    save_to_zip_file(path, data=data, params=model.get_parameters(), pytorch_variables=pytorch_variables)


def _recursive_getattr(obj: Any, name: str) -> Any:
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def save_safetensors(
    model: BaseAlgorithm, path: PathOrFile, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None
) -> None:
    """Write ``model`` as one safetensors file: every tensor of its parameters (policies, optimizer states) and of its
    attributes (normalization statistics), and the JSON description of everything else.

    :raises NotSerializableError: naming every attribute that the format cannot describe, and what to do instead.
    """
    tensors: dict[str, th.Tensor] = {}
    encoder = _Encoder(tensors)
    data = save_data(model, exclude, include)
    attributes, refused = _encode_attributes(data, encoder)
    if refused:
        details = "\n".join(f"- {name}: {reason}" for name, reason in refused.items())
        raise NotSerializableError(f"Cannot save this model in the safetensors format:\n{details}")
    _, torch_variable_names = model._get_torch_save_params()
    document = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "stable_baselines3_version": sb3.__version__,
        # Readable summaries; loading uses `attributes` and `parameters`.
        "policy_class": attributes.get("policy_class", {}).get("name"),
        "possible_agents": data.get("possible_agents"),
        "policy_keys": data.get("_policy_keys"),
        "attributes": attributes,
        "parameters": {name: encoder.encode(state, name) for name, state in model.get_parameters().items()},
        "pytorch_variables": {
            name: encoder.encode(_recursive_getattr(model, name), name) for name in torch_variable_names
        },
    }
    payload = save_safetensors_bytes(tensors, metadata={METADATA_KEY: json.dumps(document)})
    _write(path, payload)


def _write(path: PathOrFile, payload: bytes) -> None:
    if isinstance(path, (str, pathlib.Path)):
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
    else:
        path.write(payload)


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------

_ZIP_MAGIC = b"PK"


def resolve_save_format(path: PathOrFile, format: str | None) -> tuple[str, PathOrFile]:
    """Which format ``save(path, format=...)`` writes, and the path it writes to (".safetensors" added when the path
    has no suffix).

    :raises ValueError: for an unknown format, or a suffix that contradicts it.
    """
    if format not in (None, "zip", "safetensors"):
        raise ValueError(f"format must be 'zip', 'safetensors' or None (from the file suffix), got {format!r}")
    if not isinstance(path, (str, pathlib.Path)):
        return format or "zip", path
    suffix = pathlib.Path(path).suffix
    if format is None:
        return ("safetensors" if suffix == ".safetensors" else "zip"), path
    if (format, suffix) in (("safetensors", ".zip"), ("zip", ".safetensors")):
        raise ValueError(f"format={format!r} contradicts the file name {str(path)!r}: drop one, or make them agree")
    if format == "safetensors" and not suffix:
        path = pathlib.Path(path).with_suffix(".safetensors") if isinstance(path, pathlib.Path) else f"{path}.safetensors"
    return format, path


def safetensors_file(path: PathOrFile) -> PathOrFile | None:
    """``path`` if it holds a safetensors file rather than a zip (a path, or a readable, seekable file object), or
    ``path + ".safetensors"`` for a path without suffix that names no file, where that one exists (as SB3 reads
    "model" as "model.zip"); else None."""
    if isinstance(path, (str, pathlib.Path)):
        file_path = pathlib.Path(path)
        if file_path.suffix == ".safetensors":
            return path
        if not file_path.is_file():
            with_suffix = pathlib.Path(f"{file_path}.safetensors")
            if not file_path.suffix and with_suffix.is_file() and not pathlib.Path(f"{file_path}.zip").exists():
                return with_suffix
            return None  # SB3's zip loading handles missing files and the implicit ".zip".
        with file_path.open("rb") as file:
            head = file.read(9)
    else:
        position = path.tell()
        head = path.read(9)
        path.seek(position)
    is_safetensors = len(head) == 9 and not head.startswith(_ZIP_MAGIC) and head[8:9] == b"{"
    return path if is_safetensors else None


def _read_bytes(path: PathOrFile) -> bytes:
    if isinstance(path, (str, pathlib.Path)):
        return pathlib.Path(path).read_bytes()
    return path.read()


# What decoding a damaged or crafted document raises (a missing key, a list where a dict belongs, an int too large
# for numpy, nesting too deep, ...): translated into a ModelFileError that names the file and the entry.
_DAMAGE_ERRORS: tuple[type[Exception], ...] = (
    KeyError,
    TypeError,
    IndexError,
    AttributeError,
    ValueError,
    OverflowError,
    RecursionError,
)
# What rebuilding a model from a file's attributes raises when they do not fit together (an agent without a space, a
# policy_kwargs that is not a dict). ValueError is not one of them: loading onto an env that does not match the
# file's agents raises one, and says so.
_REBUILD_ERRORS: tuple[type[Exception], ...] = (KeyError, TypeError, IndexError, AttributeError)


@contextmanager
def _file_errors(source: Any, doing: str, errors: tuple[type[Exception], ...] = _DAMAGE_ERRORS) -> Iterator[None]:
    """Raise what ``errors`` (and a ModelFileError that does not name it) occur inside as a ModelFileError that names
    ``source`` and what was being done."""
    try:
        yield
    except ModelFileError as error:
        if str(source) in str(error):
            raise
        raise type(error)(f"{source}: {error}") from error
    except errors as error:
        raise ModelFileError(
            f"{source} is damaged, or was not written by sb3_ippo ({doing}): {type(error).__name__}: {error}"
        ) from error


def _entries(value: Any, source: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ModelFileError(f"{source}: its {what} are a {type(value).__name__}, not a dict of named entries")
    return value


def _safetensors_metadata(payload: bytes, source: Any) -> dict[str, Any]:
    header_size = int.from_bytes(payload[:8], "little")
    if len(payload) < 8 or 8 + header_size > len(payload):
        raise ModelFileError(
            f"{source} is not a complete safetensors file: it has {len(payload)} bytes, its header announces "
            f"{8 + header_size} or more (a truncated file?)"
        )
    try:
        header = json.loads(payload[8 : 8 + header_size])
        document = json.loads(header["__metadata__"][METADATA_KEY])
    except _DAMAGE_ERRORS as error:
        raise ModelFileError(
            f"{source} is not an sb3_ippo safetensors model: its header holds no '{METADATA_KEY}' metadata"
        ) from error
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise ModelFileError(f"{source} is not an sb3_ippo model file (its '{METADATA_KEY}' metadata names no format)")
    version = document.get("format_version", 0)
    if not isinstance(version, int):
        raise ModelFileError(f"{source}: its format_version is {version!r:.80}, not an integer")
    if version > FORMAT_VERSION:
        raise ModelFileError(
            f"{source} was written in format version {version}, newer than this sb3_ippo reads ({FORMAT_VERSION}): "
            "upgrade sb3_ippo"
        )
    return document


def load_safetensors(path: PathOrFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a file written by :func:`save_safetensors`: ``(attributes, parameters)``, tensors on the CPU.
    JSON and tensors only: nothing is unpickled.

    :raises ModelFileError: naming the file and the entry that is damaged, malformed, or over the size limits.
    """
    payload = _read_bytes(path)
    document = _safetensors_metadata(payload, path)
    attributes = _entries(document.get("attributes"), path, "attributes")
    parameters = _entries(document.get("parameters"), path, "parameters")
    with _file_errors(path, "checking the sizes it declares"):
        check_declared_sizes({**attributes, **parameters})
    try:
        tensors = load_safetensors_bytes(payload)
    except SafetensorError as error:
        raise ModelFileError(f"{path} holds damaged or truncated tensors: {error}") from error
    decoder = _Decoder(tensors)
    data, params = {}, {}
    for name, value in attributes.items():
        with _file_errors(path, f"decoding the attribute {name!r}"):
            data[name] = decoder.decode(value, name)
    for name, state in parameters.items():
        with _file_errors(path, f"decoding the parameters {name!r}"):
            params[name] = decoder.decode(state, name)
    return data, params


def _zip_payload(path: PathOrFile) -> io.BytesIO:
    """The zip's bytes, checked to be a zip."""
    payload = io.BytesIO(_read_zip_path(path) if isinstance(path, (str, pathlib.Path)) else _read_bytes(path))
    if not zipfile.is_zipfile(payload):
        raise ModelFileError(
            f"{path} is neither a zip nor a safetensors model file ({len(payload.getvalue())} bytes; a truncated or "
            "damaged file?)"
        )
    payload.seek(0)
    return payload


def _read_weights(payload: io.BytesIO, source: Any, device: th.device | str, trusted: bool, **kwargs: Any) -> tuple:
    """SB3's ``load_from_zip_file`` (its ``.pth`` entries read with ``torch.load(weights_only=True)``)."""
    try:
        return load_from_zip_file(payload, device=device, **kwargs)
    except pickle.UnpicklingError as error:
        error_type = ModelFileError if trusted else UntrustedContentError
        raise error_type(
            f"{source} holds a weights file that torch.load(weights_only=True) refused: it needs more than tensors "
            f"({error})." + ("" if trusted else " If you trust its source, load it with trusted=True.")
        ) from error
    except (ValueError, RuntimeError, EOFError, zipfile.BadZipFile) as error:
        # SB3 reports a zip it cannot read as a ValueError; torch a damaged weights file as a RuntimeError.
        raise ModelFileError(f"{source} is a damaged zip: {type(error).__name__}: {error}") from error


def load_zip_untrusted(path: PathOrFile, device: th.device | str = "auto") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read an IPPO zip without unpickling: ``(attributes, parameters)``.

    ``data`` is parsed with ``json``; each entry SB3 stored pickled is taken from the JSON twin written by
    :func:`save_zip`; the ``*.pth`` files are read with ``torch.load(weights_only=True)``.

    :raises UntrustedContentError: naming every pickled entry that has no safe description (or every pickled entry,
        for a zip saved without the twin), or a ``.pth`` file that needs more than tensors.
    :raises ModelFileError: for a file that is not a zip, or whose ``data`` or twin is damaged or malformed.
    """
    payload = _zip_payload(path)
    with _file_errors(path, "reading its 'data' entry", (*_DAMAGE_ERRORS, zipfile.BadZipFile)):
        with zipfile.ZipFile(payload) as archive:
            raw = json.loads(archive.read("data")) if "data" in archive.namelist() else {}
    raw = _entries(raw, path, "'data' entries")
    twin = raw.pop(JSON_STATE_KEY, None)
    pickled = [name for name, value in raw.items() if isinstance(value, dict) and ":serialized:" in value]
    data = {name: value for name, value in raw.items() if name not in pickled}
    if pickled and twin is None:
        raise UntrustedContentError(
            f"{path} stores {pickled} as pickles and has no safe description of them (it was saved by SB3 or an older "
            "sb3_ippo): loading it with trusted=False would need unpickling, which can run any code. If you trust its "
            "source, load it with trusted=True and re-save it (as .safetensors to share it safely)."
        )
    twin = _entries(twin or {}, path, f"'{JSON_STATE_KEY}' entries")
    described = _entries(twin.get("attributes", {}), path, "described attributes")
    refused_reasons = _entries(twin.get("refused", {}), path, "refused attributes")
    with _file_errors(path, "checking the sizes it declares"):
        check_declared_sizes({name: described[name] for name in pickled if name in described})
    decoder = _Decoder(None)
    refused = {}
    for name in pickled:
        if name in described:
            with _file_errors(path, f"decoding the description of {name!r}"):
                data[name] = decoder.decode(described[name], name)
        else:
            refused[name] = refused_reasons.get(name, "it has no safe description")
    if refused:
        details = "\n".join(f"- {name}: {reason}" for name, reason in refused.items())
        raise UntrustedContentError(
            f"{path} cannot be loaded with trusted=False: these entries would need unpickling, which can run any code:\n"
            f"{details}\nIf you trust the file's source, load it with trusted=True."
        )
    payload.seek(0)
    _, params, _ = _read_weights(payload, path, device, trusted=False, load_data=False)
    return data, params


def load_zip_trusted(
    path: PathOrFile, device: th.device | str = "auto", custom_objects: dict[str, Any] | None = None,
    print_system_info: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """SB3's zip loading, which unpickles (runs any code the file names): ``(attributes, parameters)``.

    :raises ModelFileError: for a file that is not a zip, or a damaged one.
    """
    payload = _zip_payload(path)
    data, params, _ = _read_weights(
        payload, path, device, trusted=True, custom_objects=custom_objects, print_system_info=print_system_info
    )
    if data is not None:
        data.pop(JSON_STATE_KEY, None)
    return data or {}, params


def _read_zip_path(path: str | pathlib.Path) -> bytes:
    # As SB3 does: "model" means "model.zip" when there is no file "model".
    file = open_path(path, "r", suffix="zip")
    try:
        return file.read()
    finally:
        file.close()


# ----------------------------------------------------------------------------------------------------------------
# Loading a model: read the file, set the attributes the model saves, rebuild the policies, load the weights
# ----------------------------------------------------------------------------------------------------------------

# The attributes that IPPO saves and sets outside ``__init__``: ``_use_env`` (the agents and their spaces) and
# ``_setup_model`` (the learning-rate schedule, the names made from the agent ids). Every other attribute a file holds
# is one that ``__init__`` sets, so the model ``load`` builds with ``_init_setup_model=False`` has it already.
# (tests/test_safe_serialization.py checks, for trained models of several configurations, that nothing else is saved.)
ATTRIBUTES_SET_AFTER_INIT = (
    "n_envs",
    "possible_agents",
    "observation_spaces",
    "action_spaces",
    "observation_space",
    "action_space",
    "lr_schedule",
    "_policy_keys",
    "_log_names",
)
# What a model file must hold to be an IPPO model.
REQUIRED_ATTRIBUTES = ("possible_agents", "policy_class", "policy_kwargs")
REQUIRED_PARAMETERS = ("_policies",)


def saved_attribute_names(model: BaseAlgorithm) -> frozenset[str]:
    """The attributes that ``model.save`` writes, for a ``model`` built with ``_init_setup_model=False``: those it has
    (and :data:`ATTRIBUTES_SET_AFTER_INIT`), but neither those excluded from saving nor the policies and optimizers,
    which are saved as parameters."""
    names = set(vars(model)).union(ATTRIBUTES_SET_AFTER_INIT).difference(model._excluded_save_params())
    return frozenset(name for name in names if not _is_class_attribute(type(model), name))


def restore_attributes(model: BaseAlgorithm, data: Mapping[str, Any], source: Any, safe: bool) -> None:
    """Set on ``model`` (built with ``_init_setup_model=False``) the attributes that a file of ``source`` holds: only
    names that ``model.save`` writes (:func:`saved_attribute_names`), never a name of the class (a method, a property).

    :param safe: For a file that loads without unpickling (safetensors, ``trusted=False``): an unknown name is refused.
        For a trusted zip it is skipped with a warning (see below).
    :raises ModelFileError: naming the attributes that would shadow the class's, or (``safe``) that it does not save.
    """
    cls = type(model)
    shadowing = sorted(name for name in data if _is_class_attribute(cls, name))
    if shadowing:
        raise ModelFileError(
            f"{source} sets {shadowing}, which are methods or properties of {cls.__name__}: a file it saved never holds "
            "them (a crafted or damaged file?)"
        )
    known = saved_attribute_names(model)
    unknown = sorted(set(data).difference(known))
    if unknown and safe:
        raise ModelFileError(
            f"{source} sets {unknown}, which {cls.__name__} does not save: a file that loads without unpickling may set "
            f"only the attributes its model saves (a crafted file, or one of a newer sb3_ippo?)"
        )
    if unknown:
        # SB3 sets every name a zip holds. A zip is a pickle of another version's __dict__ (SB3 and sb3_ippo add and
        # rename attributes): a name this version does not define has no reader, so setting it changes nothing but the
        # model's __dict__, and would keep a stale value that a later version might read. Skip it, and say so: if the
        # loaded model behaves differently, the names are the first clue.
        warnings.warn(
            f"{source} holds attributes that {cls.__name__} (sb3_ippo {_package_version()}) does not have: {unknown}; "
            "they are ignored (the file was saved by another version of sb3_ippo or stable-baselines3?)",
            UserWarning,
            stacklevel=3,
        )
    model.__dict__.update({name: value for name, value in data.items() if name in known})


def _package_version() -> str:
    from sb3_ippo import __version__  # here: the package imports this module

    return __version__


def _check_structure(data: Mapping[str, Any], source: Any) -> None:
    """For a safe file: the attributes the model is rebuilt from are of the types it builds from."""
    agents = data["possible_agents"]
    if not isinstance(agents, list) or not agents or not all(isinstance(agent, str) for agent in agents):
        raise ModelFileError(f"{source}: possible_agents is {agents!r:.80}, not a non-empty list of agent ids")
    for name in ("observation_spaces", "action_spaces"):
        spaces_of = data.get(name)
        if not isinstance(spaces_of, dict) or not all(isinstance(spaces_of.get(agent), spaces.Space) for agent in agents):
            raise ModelFileError(f"{source}: {name} does not map each of possible_agents {agents} to a space")
    if not isinstance(data["policy_kwargs"], dict):
        raise ModelFileError(f"{source}: policy_kwargs is {data['policy_kwargs']!r:.80}, not a dict")


def check_optimizer_states(model: Any, source: Any) -> None:
    """Every optimizer state tensor has the shape of its parameter (``load_state_dict`` does not check; a step would
    fail, or broadcast).

    :raises ModelFileError: naming the optimizer entry, the state and the shape expected.
    """
    for key, policy in model._policies.items():
        optimizer = policy.optimizer
        index = 0
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                for name, value in optimizer.state.get(parameter, {}).items():
                    if isinstance(value, th.Tensor) and value.dim() > 0 and value.shape != parameter.shape:
                        raise ModelFileError(
                            f"{source}: the entry '_policies.{key}.optimizer' state/{index}/{name} has the shape "
                            f"{list(value.shape)}, expected that of its parameter, {list(parameter.shape)}"
                        )
                index += 1


def read_model_file(
    path: PathOrFile,
    device: th.device | str = "auto",
    trusted: bool = True,
    custom_objects: dict[str, Any] | None = None,
    print_system_info: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The attributes and parameters of the IPPO model file at ``path``, and whether it was read without unpickling
    (a safetensors file, or a zip with ``trusted=False``).

    :raises ModelFileError: for a file that is damaged, crafted, or not an IPPO model.
    """
    safetensors_path = safetensors_file(path)
    if safetensors_path is not None:
        data, params = load_safetensors(safetensors_path)
    elif not trusted:
        data, params = load_zip_untrusted(path, device=device)
    else:
        data, params = load_zip_trusted(path, device, custom_objects, print_system_info)
    missing = [name for name in REQUIRED_ATTRIBUTES if name not in data]
    missing += [f"parameters {name!r}" for name in REQUIRED_PARAMETERS if name not in params]
    if missing:
        raise ModelFileError(f"{path} is not an IPPO model: it holds no per-agent policies (no {', '.join(missing)})")
    return data, params, safetensors_path is not None or not trusted


def load_model(
    cls: type[Any],
    path: PathOrFile,
    env: Any = None,
    device: th.device | str = "auto",
    trusted: bool = True,
    custom_objects: dict[str, Any] | None = None,
    print_system_info: bool = False,
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """``IPPO.load``: read the file, build ``cls`` with ``_init_setup_model=False``, set the attributes the model saves
    (:func:`restore_attributes`), adopt ``env`` (a MultiAgentVecEnv, or None), rebuild the policies, load the weights.

    For a file read without unpickling, whatever fails because its content does not fit together (a missing agent, a
    weight of the wrong shape, hyperparameters out of range) is a ModelFileError naming the file and the entry.
    """
    kwargs = dict(kwargs or {})
    data, params, safe = read_model_file(path, device, trusted, custom_objects, print_system_info)
    if "policy_kwargs" in kwargs and kwargs["policy_kwargs"] != data["policy_kwargs"]:
        raise ValueError(
            f"The specified policy kwargs {kwargs['policy_kwargs']} differ from the stored ones {data['policy_kwargs']}"
        )
    with _file_errors(path, "restoring its attributes", _REBUILD_ERRORS if safe else ()):
        if safe:
            _check_structure(data, path)
        data["policy_kwargs"].pop("device", None)
        model = cls(policy=data["policy_class"], env=None, device=device, _init_setup_model=False)
        restore_attributes(model, data, path, safe)
        model.__dict__.update(kwargs)
        if env is not None:
            check_env_matches(model.possible_agents, model.observation_spaces, model.action_spaces, env)
            model._use_env(env)
    # Past the env check, a ValueError or RuntimeError comes from the file's content: invalid hyperparameters, the
    # groups, a weight of the wrong shape, a missing optimizer (set_parameters).
    with _file_errors(path, "rebuilding the model from it", (*_REBUILD_ERRORS, ValueError, RuntimeError) if safe else ()):
        if safe:
            model._check_hyperparameters()
        model._setup_model()
        model.set_parameters(params, exact_match=True, device=device)
        if safe:
            check_optimizer_states(model, path)
    return model


__all__ = [
    "ALLOWED_CLASSES",
    "ATTRIBUTES_SET_AFTER_INIT",
    "JSON_STATE_KEY",
    "MAX_FILE_ELEMENTS",
    "MAX_SPACE_ELEMENTS",
    "POLICY_CLASSES",
    "ModelFileError",
    "NotSerializableError",
    "UntrustedContentError",
    "check_declared_sizes",
    "decode_space",
    "encode_space",
    "load_model",
    "load_safetensors",
    "load_zip_trusted",
    "load_zip_untrusted",
    "read_model_file",
    "resolve_save_format",
    "restore_attributes",
    "safetensors_file",
    "save_safetensors",
    "save_zip",
    "saved_attribute_names",
]
