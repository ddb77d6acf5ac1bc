"""Model checkpoints as users have them: one file, a sharded index, or a model directory.

A source is resolved to its weight files (shards) and, for a directory or an index, to the
``config.json`` and the other files (tokenizer, generation config ...) carried over to the
output. Every name an index gives must be a plain file name in the index's directory: an index
cannot make the converter read or write anywhere else.

A directory output is built in a temporary directory beside it and renamed into place, so a
failure (or a signal) leaves nothing half written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator

from lowprec_moe.io._common import CheckpointError
from lowprec_moe.io._safety import check_regular_file
from lowprec_moe.io.arrays import SUFFIXES

__all__ = ["Source", "open_source", "read_json", "output_directory", "INDEX_NAME"]

INDEX_NAME = "model.safetensors.index.json"
_MAX_JSON_BYTES = 64 << 20
#: Files never carried over from a source directory: weights (converted separately or not at
#: all), indices and quantization configs (written anew).
_NOT_CARRIED = (".safetensors", ".bin", ".pt", ".pth", ".npz", ".npy", ".gguf", ".ckpt",
                ".h5", ".msgpack", ".index.json")
_WRITTEN = ("config.json", "hf_quant_config.json")


@dataclass
class Source:
    """A resolved checkpoint: ``kind`` is ``"file"``, ``"index"`` or ``"dir"``.

    Attributes
    ----------
    shards : list of str
        Weight files, in the order the index first names them.
    weight_map : dict of str to str or None
        Tensor name -> shard file name, from the index (None for a single file).
    index_metadata : dict
        The index's ``metadata`` object.
    config : dict or None
        ``config.json`` of the directory.
    carried : list of str
        Other regular files of the directory, copied unchanged to a directory output.
    """

    kind: str
    path: str
    directory: str | None = None
    shards: list[str] = field(default_factory=list)
    weight_map: dict[str, str] | None = None
    index_path: str | None = None
    index_metadata: dict = field(default_factory=dict)
    config: dict | None = None
    config_path: str | None = None
    carried: list[str] = field(default_factory=list)

    def inputs(self) -> list[str]:
        """Every file read: shards, index, config and carried files."""
        extra = [p for p in (self.index_path, self.config_path) if p]
        return [*self.shards, *extra, *self.carried]


def read_json(path, what: str) -> Any:
    """A small JSON file, size-checked before it is read; errors name the file."""
    path = os.fspath(path)
    st = check_regular_file(path, what)
    if st.st_size > _MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: {what} is {st.st_size} bytes, more than the "
                              f"{_MAX_JSON_BYTES} a JSON file of this kind may have")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: {what} is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({exc.msg} at byte "
                              f"{exc.pos})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: {what} is nested too deeply") from None


def _plain_name(name: str, index: str) -> str:
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name):
        raise CheckpointError(f"{index}: shard name {name!r} must be a plain file name in "
                              "the index's directory")
    if not name.endswith(".safetensors"):
        raise CheckpointError(f"{index}: shard {name!r} is not a .safetensors file")
    return name


def _open_index(path: str, src: Source) -> None:
    index = read_json(path, "index")
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise CheckpointError(f"{path}: an index must be a JSON object with a 'weight_map' "
                              "object (tensor name -> shard file)")
    meta = index.get("metadata", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: 'metadata' must be an object, got "
                              f"{type(meta).__name__}")
    directory = os.path.dirname(os.path.abspath(path))
    weight_map = {}
    for name, shard in index["weight_map"].items():
        weight_map[name] = _plain_name(shard, path)
    if not weight_map:
        raise CheckpointError(f"{path}: the weight_map is empty")
    shards = list(dict.fromkeys(weight_map.values()))
    src.index_path, src.index_metadata, src.weight_map = path, meta, weight_map
    src.directory = directory
    src.shards = [os.path.join(directory, s) for s in shards]
    for shard in src.shards:
        check_regular_file(shard, "shard")


def _carried(directory: str, skip: set[str]) -> list[str]:
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if (entry.name in skip or entry.name in _WRITTEN or entry.name.startswith(".")
                or entry.name.endswith(_NOT_CARRIED)):
            continue
        if entry.is_file(follow_symlinks=True):
            out.append(entry.path)
    return out


def open_source(path) -> Source:
    """Resolve a weight file, a ``*.index.json`` or a model directory.

    Raises
    ------
    FileNotFoundError
        ``path`` or a shard it names does not exist.
    CheckpointError
        A bad index (shard names outside the directory, not JSON ...) or a directory without
        weights or with several unindexed ``.safetensors`` files.
    ValueError
        An unsupported file type, or a FIFO / device.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        src = Source(kind="dir", path=path, directory=os.path.abspath(path))
        index = os.path.join(path, INDEX_NAME)
        if os.path.exists(index):
            _open_index(index, src)
        else:
            weights = sorted(e.name for e in os.scandir(path)
                             if e.name.endswith(".safetensors") and not e.name.startswith("."))
            if not weights:
                raise CheckpointError(f"{path}: the directory holds no .safetensors weights "
                                      f"and no {INDEX_NAME}")
            if len(weights) > 1:
                raise CheckpointError(f"{path}: {len(weights)} .safetensors files and no "
                                      f"{INDEX_NAME} to say which tensor is where")
            src.shards = [os.path.join(path, weights[0])]
            check_regular_file(src.shards[0], "weights")
        config = os.path.join(path, "config.json")
        if os.path.exists(config):
            src.config = read_json(config, "config.json")
            if not isinstance(src.config, dict):
                raise CheckpointError(f"{config}: config.json must be a JSON object")
            src.config_path = config
        skip = {os.path.basename(s) for s in src.shards}
        src.carried = _carried(path, skip)
        return src
    if path.endswith(".index.json"):
        src = Source(kind="index", path=path)
        _open_index(path, src)
        return src
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{path!r}: unsupported input {suffix or '(no suffix)'!r}; use a "
                         f"{', '.join(SUFFIXES)} file, a *.index.json or a model directory")
    check_regular_file(path)
    return Source(kind="file", path=path, shards=[path])


@contextlib.contextmanager
def output_directory(dst, *, force: bool) -> Iterator[str]:
    """A temporary directory beside ``dst`` that becomes ``dst`` when the block succeeds.

    An existing ``dst`` (allowed by ``force``; the caller checked it holds no input) is moved
    aside first and deleted only after the new directory is in place.
    """
    dst = os.path.abspath(os.fspath(dst))
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise FileNotFoundError(2, "output directory's parent does not exist", parent)
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise NotADirectoryError(20, "output exists and is not a directory", dst)
    tmp = tempfile.mkdtemp(dir=parent, prefix="." + os.path.basename(dst) + ".", suffix=".tmp")
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        old = None
        if os.path.lexists(dst):
            if not force:
                raise FileExistsError(17, "output exists", dst)
            old = tempfile.mkdtemp(dir=parent, prefix="." + os.path.basename(dst) + ".",
                                   suffix=".old")
            os.rmdir(old)
            os.rename(dst, old)
        os.rename(tmp, dst)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
