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
import pathlib
import pickle
import zipfile
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import stable_baselines3 as sb3
import torch as th
from gymnasium import spaces
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.save_util import is_json_serializable, load_from_zip_file, open_path, save_to_zip_file
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.torch_layers import CombinedExtractor, FlattenExtractor, NatureCNN
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule
from torch import nn

from sb3_ippo.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.ppo_update import UpdateStats

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

FORMAT_NAME = "sb3_ippo"
FORMAT_VERSION = 1
# The key of the safetensors metadata entry that holds the JSON document.
METADATA_KEY = "sb3_ippo"
# The key, in a zip's `data` entry, of the JSON description of the entries SB3 pickled.
JSON_STATE_KEY = "_sb3_ippo_json_state"

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


class UntrustedContentError(ValueError):
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
    """Decodes what :class:`_Encoder` wrote. Only the tags below exist; anything else is refused."""

    def __init__(self, tensors: Mapping[str, th.Tensor] | None) -> None:
        self.tensors = tensors

    def decode(self, value: Any, path: str) -> Any:  # noqa: C901 (one branch per tag)
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
            cls = STATE_CLASSES.get(value["class"])
            if cls is None:
                raise UntrustedContentError(f"{path} names the class {value['class']!r}, which a safe model file may not hold")
            obj: Any = object.__new__(cls)
            obj.__dict__.update(self.decode(value["state"], path))
            return obj
        if tag in _SPACE_TAGS:
            return decode_space(value, path)
        raise UntrustedContentError(f"{path} has the unknown type tag {tag!r}")

    def _tensor(self, name: str, path: str) -> th.Tensor:
        if self.tensors is None or name not in self.tensors:
            raise UntrustedContentError(f"{path} refers to the tensor {name!r}, which the file does not hold")
        return self.tensors[name]


def _checked_dtype(name: str, path: str) -> np.dtype:
    dtype = np.dtype(name)
    if dtype.kind not in _NUMERIC_DTYPE_KINDS:
        raise UntrustedContentError(f"{path} has the dtype {name!r}; a safe model file holds numeric arrays only")
    return dtype


def _allowed_class(name: str, path: str) -> type:
    cls = ALLOWED_CLASSES.get(name)
    if cls is None:
        raise UntrustedContentError(
            f"{path} names the class {name!r}, which is not in the allow-list of classes a safe model file may name"
        )
    return cls


_SPACE_TAGS = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "DictSpace")


def decode_space(description: Mapping[str, Any], path: str = "space") -> spaces.Space:
    """The gymnasium space that :func:`encode_space` described."""
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
        return spaces.Dict({key: decode_space(sub, f"{path}/{key}") for key, sub in description["items"]})
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


def _safetensors_metadata(payload: bytes, source: Any) -> dict[str, Any]:
    header_size = int.from_bytes(payload[:8], "little")
    try:
        header = json.loads(payload[8 : 8 + header_size])
        document = json.loads(header["__metadata__"][METADATA_KEY])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{source} is not an sb3_ippo safetensors model: its header holds no '{METADATA_KEY}' metadata"
        ) from error
    if document.get("format") != FORMAT_NAME:
        raise ValueError(f"{source} is not an sb3_ippo model file (format {document.get('format')!r})")
    if document.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{source} was written in format version {document['format_version']}, newer than this sb3_ippo reads "
            f"({FORMAT_VERSION}): upgrade sb3_ippo"
        )
    return document


def load_safetensors(path: PathOrFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a file written by :func:`save_safetensors`: ``(attributes, parameters)``, tensors on the CPU.
    JSON and tensors only: nothing is unpickled."""
    payload = _read_bytes(path)
    document = _safetensors_metadata(payload, path)
    try:
        decoder = _Decoder(load_safetensors_bytes(payload))
        data = {name: decoder.decode(value, name) for name, value in document["attributes"].items()}
        params = {name: decoder.decode(state, name) for name, state in document["parameters"].items()}
    except UntrustedContentError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{path} is a damaged sb3_ippo safetensors file: {type(error).__name__}: {error}") from error
    return data, params


def load_zip_untrusted(path: PathOrFile, device: th.device | str = "auto") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read an IPPO zip without unpickling: ``(attributes, parameters)``.

    ``data`` is parsed with ``json``; each entry SB3 stored pickled is taken from the JSON twin written by
    :func:`save_zip`; the ``*.pth`` files are read with ``torch.load(weights_only=True)``.

    :raises UntrustedContentError: naming every pickled entry that has no safe description (or every pickled entry,
        for a zip saved without the twin), or a ``.pth`` file that needs more than tensors.
    """
    payload = io.BytesIO(_read_bytes(path) if not isinstance(path, (str, pathlib.Path)) else _read_zip_path(path))
    try:
        with zipfile.ZipFile(payload) as archive:
            raw = json.loads(archive.read("data")) if "data" in archive.namelist() else {}
    except zipfile.BadZipFile as error:
        raise ValueError(f"Error: the file {path} wasn't a zip-file") from error
    twin = raw.pop(JSON_STATE_KEY, None)
    pickled = [name for name, value in raw.items() if isinstance(value, dict) and ":serialized:" in value]
    data = {name: value for name, value in raw.items() if name not in pickled}
    if pickled and twin is None:
        raise UntrustedContentError(
            f"{path} stores {pickled} as pickles and has no safe description of them (it was saved by SB3 or an older "
            "sb3_ippo): loading it with trusted=False would need unpickling, which can run any code. If you trust its "
            "source, load it with trusted=True and re-save it (as .safetensors to share it safely)."
        )
    decoder = _Decoder(None)
    refused = {}
    for name in pickled:
        if name in twin.get("attributes", {}):
            try:
                data[name] = decoder.decode(twin["attributes"][name], name)
            except UntrustedContentError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                raise ValueError(f"{path} has a damaged description of {name!r}: {type(error).__name__}: {error}") from error
        else:
            refused[name] = twin.get("refused", {}).get(name, "it has no safe description")
    if refused:
        details = "\n".join(f"- {name}: {reason}" for name, reason in refused.items())
        raise UntrustedContentError(
            f"{path} cannot be loaded with trusted=False: these entries would need unpickling, which can run any code:\n"
            f"{details}\nIf you trust the file's source, load it with trusted=True."
        )
    payload.seek(0)
    try:
        _, params, _ = load_from_zip_file(payload, load_data=False, device=device)
    except pickle.UnpicklingError as error:
        raise UntrustedContentError(
            f"{path} holds a weights file that torch.load(weights_only=True) refused: it needs more than tensors "
            f"({error}). If you trust its source, load it with trusted=True."
        ) from error
    return data, params


def _read_zip_path(path: str | pathlib.Path) -> bytes:
    # As SB3 does: "model" means "model.zip" when there is no file "model".
    file = open_path(path, "r", suffix="zip")
    try:
        return file.read()
    finally:
        file.close()


__all__ = [
    "ALLOWED_CLASSES",
    "JSON_STATE_KEY",
    "POLICY_CLASSES",
    "NotSerializableError",
    "UntrustedContentError",
    "decode_space",
    "encode_space",
    "load_safetensors",
    "load_zip_untrusted",
    "resolve_save_format",
    "safetensors_file",
    "save_safetensors",
    "save_zip",
]
