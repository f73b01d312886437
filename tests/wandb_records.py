"""Read what an offline Weights & Biases run wrote (``wandb/offline-run-*/run-*.wandb``), to test it without a
server. The file is a LevelDB-style log of protobuf ``Record``s: a 7-byte header (``:W&B``, magic, version), then
32 KiB blocks of chunks, each with a 7-byte header (checksum, length, type: full, first, middle, last)."""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

BLOCK = 32 * 1024
HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: pathlib.Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"{path} is not a wandb run file"
    position, pending = 7, b""
    while position + HEADER.size <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER.size:
            position += left  # the block's zero padding
            continue
        _checksum, length, kind = HEADER.unpack_from(data, position)
        if kind == 0:
            position += left
            continue
        chunk = data[position + HEADER.size : position + HEADER.size + length]
        position += HEADER.size + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


@dataclass
class OfflineRun:
    history_keys: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    config_keys: set[str] = field(default_factory=set)


def read_offline_run(folder: pathlib.Path) -> OfflineRun:
    """The metrics' keys, the saved files and the config keys of the one offline run under ``folder``."""
    from wandb.proto import wandb_internal_pb2

    (path,) = folder.glob("**/offline-run-*/run-*.wandb")
    run = OfflineRun()
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run.history_keys.update(item.key or "/".join(item.nested_key) for item in record.history.item)
        elif kind == "files":
            run.files.update(file.path for file in record.files.files)
        elif kind == "config":
            run.config_keys.update(item.key or "/".join(item.nested_key) for item in record.config.update)
        elif kind == "run":  # wandb.init(config=...)
            run.config_keys.update(item.key or "/".join(item.nested_key) for item in record.run.config.update)
    return run
