"""Model files that load without running code: a safetensors format, and a JSON twin of the zip's pickled entries.

SB3's zip format stores every attribute that JSON cannot hold (spaces, schedules, the policy class, the
normalization statistics, ...) as a cloudpickle, and unpickling runs whatever code the file names: a model file
from an untrusted source can run any command when it is loaded. This package gives two ways out:

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

The package, one module per concern:

- :mod:`~sb3_ippo.serialization.errors`: what a damaged, crafted or unsafe file raises (:class:`ModelFileError`,
  :class:`UntrustedContentError`, :class:`NotSerializableError`);
- :mod:`~sb3_ippo.serialization.sizes`: the sizes a file declares, bounded before anything is built
  (:data:`MAX_SPACE_ELEMENTS`, :data:`MAX_FILE_ELEMENTS`);
- :mod:`~sb3_ippo.serialization.encoding`: the tagged JSON-plus-tensors encoding, gymnasium spaces, and the classes a
  file may name;
- :mod:`~sb3_ippo.serialization.files`: writing and reading the two formats (zip with its JSON twin, safetensors);
- :mod:`~sb3_ippo.serialization.loading`: building a model from what a file holds (``IPPO.load``).
"""

from sb3_ippo.serialization.encoding import (
    ALLOWED_CLASSES,
    POLICY_CLASSES,
    STATE_CLASSES,
    allow_class,
    class_name,
    decode_space,
    encode_space,
)
from sb3_ippo.serialization.errors import ModelFileError, NotSerializableError, UntrustedContentError
from sb3_ippo.serialization.files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    JSON_STATE_KEY,
    METADATA_KEY,
    PathOrFile,
    check_zip_file,
    json_state,
    load_safetensors,
    load_zip_trusted,
    load_zip_untrusted,
    resolve_save_format,
    safetensors_file,
    save_data,
    save_safetensors,
    save_zip,
)
from sb3_ippo.serialization.loading import (
    ATTRIBUTES_SET_AFTER_INIT,
    REQUIRED_ATTRIBUTES,
    REQUIRED_PARAMETERS,
    check_optimizer_states,
    load_model,
    read_model_file,
    restore_attributes,
    saved_attribute_names,
)
from sb3_ippo.serialization.sizes import MAX_FILE_ELEMENTS, MAX_SPACE_ELEMENTS, check_declared_sizes

__all__ = [
    "ALLOWED_CLASSES",
    "ATTRIBUTES_SET_AFTER_INIT",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "JSON_STATE_KEY",
    "MAX_FILE_ELEMENTS",
    "MAX_SPACE_ELEMENTS",
    "METADATA_KEY",
    "POLICY_CLASSES",
    "REQUIRED_ATTRIBUTES",
    "REQUIRED_PARAMETERS",
    "STATE_CLASSES",
    "ModelFileError",
    "NotSerializableError",
    "PathOrFile",
    "UntrustedContentError",
    "allow_class",
    "check_declared_sizes",
    "check_optimizer_states",
    "check_zip_file",
    "class_name",
    "decode_space",
    "encode_space",
    "json_state",
    "load_model",
    "load_safetensors",
    "load_zip_trusted",
    "load_zip_untrusted",
    "read_model_file",
    "resolve_save_format",
    "restore_attributes",
    "safetensors_file",
    "save_data",
    "save_safetensors",
    "save_zip",
    "saved_attribute_names",
]
