"""What a damaged, crafted or unsafe model file raises, and how errors met while reading one become a ModelFileError
that names the file and the entry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class NotSerializableError(ValueError):
    """A value the safe encoding cannot describe (arbitrary callables, classes outside the allow-list, ...)."""


class ModelFileError(ValueError):
    """A model file that is damaged, truncated, or crafted: not a zip or safetensors file, an entry missing or of the
    wrong type or shape, a declared size over the limits (:data:`~sb3_ippo.serialization.sizes.MAX_SPACE_ELEMENTS`),
    an attribute the model does not save. The message names the file and what is wrong."""


class UntrustedContentError(ModelFileError):
    """A model file holds something that only unpickling could restore, or that the safe decoding does not know."""


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
