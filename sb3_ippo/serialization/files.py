"""The two file formats, written and read: SB3's zip with the JSON twin of its pickled entries, and one safetensors
file. Reading returns ``(attributes, parameters)``; :mod:`sb3_ippo.serialization.loading` builds the model from them.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import zipfile
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import stable_baselines3 as sb3
import torch as th
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from stable_baselines3.common.save_util import is_json_serializable, load_from_zip_file, save_to_zip_file

from sb3_ippo.serialization.encoding import POLICY_CLASSES, _Decoder, _Encoder
from sb3_ippo.serialization.errors import (
    _DAMAGE_ERRORS,
    ModelFileError,
    NotSerializableError,
    UntrustedContentError,
    _entries,
    _file_errors,
)
from sb3_ippo.serialization.sizes import check_declared_sizes
from sb3_ippo.update.settings import SCHEDULED_SETTINGS

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

FORMAT_NAME = "sb3_ippo"
FORMAT_VERSION = 1
# The key of the safetensors metadata entry that holds the JSON document.
METADATA_KEY = "sb3_ippo"
# The key, in a zip's `data` entry, of the JSON description of the entries SB3 pickled.
JSON_STATE_KEY = "_sb3_ippo_json_state"

PathOrFile = str | pathlib.Path | io.BufferedIOBase


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
    if name in (*SCHEDULED_SETTINGS, "lr_schedule"):
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


def _cut_short(payload: io.BytesIO) -> bool:
    """Whether ``payload`` is the beginning of a zip without its end: it starts with a zip entry, but the zip's
    directory (at the end of the file) is missing, or the one found is that of a zip stored inside it (torch's
    weight files are zips), which does not list the first entry."""
    data = payload.getvalue()
    if not data.startswith(b"PK\x03\x04") or len(data) < 30:
        return False
    name_length = int.from_bytes(data[26:28], "little")
    first_entry = data[30 : 30 + name_length].decode("utf-8", errors="replace")
    try:
        with zipfile.ZipFile(payload) as archive:
            return first_entry not in archive.namelist()
    except zipfile.BadZipFile:
        return True
    finally:
        payload.seek(0)


def check_zip_file(path: PathOrFile) -> io.BytesIO:
    """The bytes of the zip at ``path`` (or of an open file), checked to be a whole zip.

    :raises ModelFileError: naming the file, if it is a zip cut short (a truncated copy or an interrupted save), or
        not a zip at all.
    """
    payload = io.BytesIO(_read_zip_path(path) if isinstance(path, (str, pathlib.Path)) else _read_bytes(path))
    size = len(payload.getvalue())
    if _cut_short(payload):
        raise ModelFileError(
            f"{path} is a damaged zip, cut short: its {size} bytes are the beginning of a zip without its end (a "
            "truncated file: an interrupted copy, download or save?)"
        )
    if not zipfile.is_zipfile(payload):
        raise ModelFileError(
            f"{path} is neither a zip nor a safetensors model file ({size} bytes; a truncated or damaged file?)"
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
    payload = check_zip_file(path)
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
    payload = check_zip_file(path)
    data, params, _ = _read_weights(
        payload, path, device, trusted=True, custom_objects=custom_objects, print_system_info=print_system_info
    )
    if data is not None:
        data.pop(JSON_STATE_KEY, None)
    return data or {}, params


def _read_zip_path(path: str | pathlib.Path) -> bytes:
    """The bytes of the file at ``path``, or, as SB3 reads "model" as "model.zip", of ``path + ".zip"`` when ``path``
    names no file.

    :raises FileNotFoundError: naming the path given and every path tried (SB3's own error names only the last, as
        "model.zip.zip" for "model.zip").
    """
    given = pathlib.Path(path)
    candidates = [given] if given.suffix == ".zip" else [given, pathlib.Path(f"{given}.zip")]
    for candidate in candidates:
        if candidate.exists():
            return candidate.read_bytes()
    tried = candidates + ([pathlib.Path(f"{given}.safetensors")] if not given.suffix else [])  # see safetensors_file
    also = f" (tried {', '.join(map(str, tried[:-1]))} and {tried[-1]})" if len(tried) > 1 else ""
    raise FileNotFoundError(f"No model file {str(path)!r}{also}")
