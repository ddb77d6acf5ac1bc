"""Quantize and dequantize whole checkpoints: a file, a sharded index or a model directory.

The output has the input's shape: a file gives a file; an index or a directory gives a directory
with one output shard per input shard (same file names), ``model.safetensors.index.json``,
``config.json`` (with ``quantization_config``), ModelOpt's ``hf_quant_config.json`` and the
other files of the source directory. Tensors stream one at a time from memory-mapped inputs.
Nothing is written over an input, an existing output is replaced only with ``force``, and
outputs appear atomically.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Sequence

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe import quant_formats
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor
from lowprec_moe.io._common import CheckpointError, atomic_output, check_output_path
from lowprec_moe.io._safety import check_output_target
from lowprec_moe.io.arrays import file_kind
from lowprec_moe.io.checkpoint import CheckpointWriter, array_names, open_checkpoint
from lowprec_moe.io.model_dir import INDEX_NAME, Source, open_source, output_directory
from lowprec_moe.io._shard import default_jobs, quantize_shard
from lowprec_moe.io.progress import NoProgress
from lowprec_moe.io.selection import decide, expert_name
from lowprec_moe.io.serving import check_layout, hf_quant_config, quantization_config

__all__ = ["quantize_model", "dequantize_model"]



def _check_output(source, dst, force: bool) -> None:
    """Refuse an output that does not fit the input's shape (a directory for a sharded or
    directory input), a bad output path, or one that is an input or exists without ``force``."""
    if source.kind != "file" and os.path.splitext(os.fspath(dst))[1].lower() in (
            ".safetensors", ".npz", ".npy"):
        raise ValueError(f"output {os.fspath(dst)!r}: a sharded / directory input gives a "
                         "directory output; name a directory")
    if source.kind == "file":
        check_output_path(dst)
    check_output_target(dst, source.inputs(), force=force)

def _version() -> str:
    from lowprec_moe import __version__

    return __version__


def _out_names(name: str, format: str, layout: str, columnwise: bool) -> list[str]:
    if layout == "compressed-tensors":
        return [name + "_packed", name + "_scale", name + "_global_scale"]
    if layout == "modelopt":
        return [name, name + "_scale"] + ([name + "_scale_2"]
                                           if quant_formats.get(format).has_amax else [])
    return array_names(name, format, columnwise=columnwise)


def _check_shard(ck, src: Source, shard: str) -> None:
    if src.weight_map is None:
        return
    base = os.path.basename(shard)
    for name in ck.arrays.keys():
        if src.weight_map.get(name) != base:
            raise CheckpointError(f"{shard}: tensor {name!r} is not mapped to this shard by "
                                  f"{src.index_path}")


def _plan(src: Source, format, opts, layout, keys, exclude, experts):
    """Open every shard, decide per tensor, check names; returns (checkpoints, plans, total)."""
    cks, plans, total, owner = [], [], 0, {}
    seen: set[str] = set()
    try:
        for shard in src.shards:
            ck = open_checkpoint(shard)
            cks.append(ck)
            done = [n for n, e in ck.entries.items() if e["type"] != "array"]
            if done:
                raise CheckpointError(f"{shard} already holds quantized tensors "
                                      f"({', '.join(done[:3])}); dequantize it first")
            _check_shard(ck, src, shard)
            plan = {}
            for name in ck.names():
                dtype, shape = ck.arrays.info(name)
                d = decide(name, dtype, tuple(shape), format, opts, keys=keys, exclude=exclude,
                           experts=experts)
                plan[name] = d
                total += math.prod(shape) * dtype.itemsize
                seen.add(name)
                if d.action == "split":
                    outs = [n for i in range(shape[0])
                            for n in _out_names(expert_name(name, i), format, layout, False)]
                elif d.action == "copy":
                    outs = [name]
                else:
                    outs = _out_names(name, format, layout, opts["columnwise"])
                for out in outs:
                    if out in owner:
                        raise ValueError(
                            f"name clash: output array {out!r} is needed by both tensor "
                            f"{owner[out]!r} and tensor {name!r} (a quantized tensor NAME also "
                            "writes NAME_scale ...); exclude one with --exclude or --keys")
                    owner[out] = name
            plans.append(plan)
        if src.weight_map is not None:
            missing = [n for n in src.weight_map if n not in seen]
            if missing:
                raise CheckpointError(f"{src.index_path}: tensors {missing[:3]} are in the "
                                      "index but in none of its shards")
        if keys and all(d.reason == "not selected by --keys" for p in plans for d in p.values()):
            names = [n for p in plans for n in p]
            raise ValueError(f"no tensor name matches keys={list(keys)} (names: "
                             f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''})")
    except BaseException:
        for ck in cks:
            ck.close()
        raise
    return cks, plans, total


def quantize_model(src, dst, format: str, *, layout: str = "modelopt",
                   columnwise: bool = False, row_scaled: bool = False, block_2d: bool = False,
                   fp8_dtype: str | None = None, keys: Sequence[str] | None = None,
                   exclude: Sequence[str] | None = None, experts: str = "split",
                   device: str = "cpu", allow_nonfinite: bool = False, force: bool = False,
                   jobs: int | None = None, progress=None):
    """Quantize a checkpoint (file, index or directory); see :func:`convert.quantize_file`."""
    from lowprec_moe.io.convert import ConvertReport, quantize_options, select_device

    opts = quantize_options(format, columnwise=columnwise, row_scaled=row_scaled,
                            block_2d=block_2d, fp8_dtype=fp8_dtype)
    if experts not in ("split", "fused", "flat"):
        raise ValueError(f"experts={experts!r} must be 'split', 'fused' or 'flat'")
    check_layout(layout, format, opts, experts)
    source = open_source(src)
    if source.kind == "file" and file_kind(dst) == "npy":
        raise ValueError(f"output {os.fspath(dst)!r}: quantized tensors need .safetensors or "
                         ".npz")
    _check_output(source, dst, force)
    xp = select_device(device)
    jobs = default_jobs() if jobs is None else jobs
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs={jobs!r} must be a positive int")
    progress = progress or NoProgress()
    cks, plans, total = _plan(source, format, opts, layout, keys, exclude, experts)
    report = ConvertReport(output=os.fspath(dst), layout=layout)
    try:
        progress.start(total, "quantizing")
        if source.kind == "file":
            quantize_shard(cks[0], plans[0], dst, format, opts, layout, xp, allow_nonfinite,
                           report, progress, jobs=jobs,
                           extra_meta=_file_meta(format, layout, report))
            report.bytes_out = os.path.getsize(dst)
        else:
            with output_directory(dst, force=force) as tmp:
                weight_map = {}
                for ck, plan, shard in zip(cks, plans, source.shards):
                    out = os.path.join(tmp, os.path.basename(shard))
                    names = quantize_shard(ck, plan, out, format, opts, layout, xp,
                                           allow_nonfinite, report, progress, jobs=jobs)
                    weight_map.update({n: os.path.basename(shard) for n in names})
                _finish_directory(tmp, source, weight_map, report,
                                  quant=(format, layout))
        progress.finish()
    finally:
        for ck in cks:
            ck.close()
    return report


def _file_meta(format, layout, report) -> dict[str, str]:
    if layout == "lowprec":
        return {}
    return {"quantization": json.dumps(hf_quant_config(format, [], _version())["quantization"])}


def _write_json(path: str, obj) -> None:
    with atomic_output(path) as f:
        f.write((json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def _finish_directory(tmp: str, source: Source, weight_map: dict, report, quant=None) -> None:
    """Index, config.json (and hf_quant_config.json) and carried files of a directory output."""
    total = sum(os.path.getsize(os.path.join(tmp, f)) for f in set(weight_map.values()))
    if source.weight_map is not None or len(set(weight_map.values())) > 1:
        meta = {**source.index_metadata, "total_size": total}
        _write_json(os.path.join(tmp, INDEX_NAME), {"metadata": meta, "weight_map": weight_map})
    config = dict(source.config) if source.config is not None else None
    if quant is not None:
        format, layout = quant
        excluded = sorted(set(report.excluded_modules))
        if layout != "lowprec":
            config = config if config is not None else {}
            config["quantization_config"] = quantization_config(format, layout, excluded,
                                                                _version())
        if layout == "modelopt":
            _write_json(os.path.join(tmp, "hf_quant_config.json"),
                        hf_quant_config(format, excluded, _version()))
    elif config is not None:
        qc = config.get("quantization_config")
        if isinstance(qc, dict) and isinstance(qc.get("producer"), dict) and \
                qc["producer"].get("name") == "lowprec_moe":
            del config["quantization_config"]
    if config is not None:
        _write_json(os.path.join(tmp, "config.json"), config)
    for path in source.carried:
        shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
    report.bytes_out = total
    report.files = sorted(os.listdir(tmp))


def _out_dtype(dtype: str | None, e: dict) -> str:
    if dtype is not None:
        return dtype
    want = e.get("original_dtype")
    return want if want in F.DEQUANT_DTYPES else "float32"


def dequantize_model(src, dst, *, dtype: str | None = None, direction: str = "rowwise",
                     force: bool = False, progress=None):
    """Dequantize a checkpoint (file, index or directory); see :func:`convert.dequantize_file`."""
    from lowprec_moe import _validate as V
    from lowprec_moe.io.convert import ConvertReport

    if dtype is not None:
        dtype = V.check_dequant_dtype(dtype)
    V.check_direction(direction)
    source = open_source(src)
    _check_output(source, dst, force)
    progress = progress or NoProgress()
    cks = []
    report = ConvertReport(output=os.fspath(dst))
    try:
        for shard in source.shards:
            cks.append(open_checkpoint(shard))
        if not any(e["type"] != "array" for ck in cks for e in ck.entries.values()):
            raise CheckpointError(f"{os.fspath(src)!r} holds no quantized tensors")
        total = sum(math.prod(ck.arrays.info(k)[1]) * ck.arrays.info(k)[0].itemsize
                    for ck in cks for k in ck.arrays.keys())
        progress.start(total, "dequantizing")
        if source.kind == "file":
            ck = cks[0]
            if file_kind(dst) == "npy":
                _check_npy_output(ck, dst, dtype)
            _dequantize_shard(ck, dst, dtype, direction, report, progress)
            report.bytes_out = os.path.getsize(dst)
        else:
            with output_directory(dst, force=force) as tmp:
                weight_map = {}
                for ck, shard in zip(cks, source.shards):
                    out = os.path.join(tmp, os.path.basename(shard))
                    names = _dequantize_shard(ck, out, dtype, direction, report, progress)
                    weight_map.update({n: os.path.basename(shard) for n in names})
                _finish_directory(tmp, source, weight_map, report)
        progress.finish()
    finally:
        for ck in cks:
            ck.close()
    return report


def _check_npy_output(ck, dst, dtype) -> None:
    names = ck.names()
    stacks = {e["split_from"]["name"] for e in ck.entries.values()
              if isinstance(e.get("split_from"), dict)}
    plain = [n for n in names if not isinstance(ck.entries[n].get("split_from"), dict)]
    if len(plain) + len(stacks) != 1:
        raise ValueError(f"output {os.fspath(dst)!r}: a .npy file holds one array, the input "
                         f"has {len(plain) + len(stacks)} tensors; write .safetensors or .npz")
    e = ck.entries[names[0]]
    out = _out_dtype(dtype, e) if e["type"] != "array" else e.get("dtype")
    if out == "bfloat16":
        raise ValueError(f"output {os.fspath(dst)!r}: NumPy cannot read bfloat16 from a .npy "
                         "file (it would see raw |V2 bytes); pass --dtype float32 or write "
                         ".safetensors")


def _dequantize_shard(ck, out, dtype, direction, report, progress) -> list[str]:
    pending: dict[str, list] = {}
    with CheckpointWriter(out, hold=True) as w:
        for name in ck.names():
            e = ck.entries[name]
            try:
                t = ck.get(name)
                nbytes = sum(math.prod(ck.arrays.info(k)[1]) * ck.arrays.info(k)[0].itemsize
                             for k in ([name] if e["type"] == "array"
                                       else [*e["arrays"].values(),
                                             *e.get("aux_arrays", {}).values()]))
                if not isinstance(t, (QuantizedTensor, GroupedTensor)):
                    w.add(name, t)
                    report.copied.append((name, "not quantized"))
                    progress.advance(nbytes, name)
                    continue
                if getattr(t, f"{direction}_data") is None:
                    raise ValueError(f"tensor {name!r} has no {direction} copy")
                x = t.dequantize(direction, _out_dtype(dtype, e))
                shape = _original_shape(e, x.size)
                x = x.reshape(shape) if shape else x
                split = e.get("split_from")
                if _valid_split(split):
                    parts = pending.setdefault(split["name"], [None] * split["count"])
                    parts[split["index"]] = x
                    if all(p is not None for p in parts):
                        w.add(split["name"], np.stack(parts))
                        report.converted.append(split["name"])
                        del pending[split["name"]]
                else:
                    w.add(name, x)
                    report.converted.append(name)
            except CheckpointError:
                raise
            except (ValueError, TypeError) as exc:
                msg = str(exc)
                raise type(exc)(f"{ck.path}: {msg if name in msg else f'tensor {name!r}: {msg}'}"
                                ) from None
            progress.advance(nbytes, name)
        if pending:
            stack, parts = next(iter(pending.items()))
            raise CheckpointError(f"{ck.path}: expert stack {stack!r} is missing experts "
                                  f"{[i for i, p in enumerate(parts) if p is None][:8]}")
        w.commit(ck.metadata)
        return list(w._writer.names)


def _valid_split(split) -> bool:
    return (isinstance(split, dict) and isinstance(split.get("name"), str)
            and type(split.get("count")) is int and type(split.get("index")) is int
            and 0 <= split["index"] < split["count"] <= 1 << 20)


def _original_shape(e: dict, size: int) -> tuple | None:
    shape = e.get("original_shape")
    if (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)
            and math.prod(shape) == size):
        return tuple(shape)
    return None
