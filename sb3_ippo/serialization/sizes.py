"""The sizes a model file declares, bounded (:data:`MAX_SPACE_ELEMENTS`, :data:`MAX_FILE_ELEMENTS`) before anything
is built from them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sb3_ippo.serialization.errors import ModelFileError

# The largest size a file may declare for one space, and for all its spaces and inline arrays together, checked before
# anything is built: a few bytes of JSON can declare a Box that gymnasium would fill with a terabyte. A space's size
# is what SB3 allocates for it: the elements of a Box or MultiBinary (and of an inline array), n of a Discrete, the
# sum of a MultiDiscrete's nvec (the width of its one-hot input or action layer); a Dict adds up its members.
# 2**24 elements hold an image of 2048 x 2048 x 4; a file holds each space about twice (per agent, and the Dict of all).
MAX_SPACE_ELEMENTS = 2**24
MAX_FILE_ELEMENTS = 2**26


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
