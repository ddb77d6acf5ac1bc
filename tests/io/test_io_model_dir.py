"""Model directories in, model directories out: shards + index, config.json with the
quantization config, ModelOpt's hf_quant_config.json, per-expert tensors, default exclusions,
original dtypes on the way back, and byte progress."""

from __future__ import annotations

import io
import json
import os

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import lowprec_moe as lpm
from lowprec_moe import cli
from lowprec_moe import io as lio
from lowprec_moe.io import convert
from lowprec_moe.io.progress import ByteProgress
from lowprec_moe.io.safetensors import SafetensorsFile

BF16 = ml_dtypes.bfloat16
G = 4


def run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def _x(shape, seed, dtype=BF16):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(dtype)


def _shards():
    return [
        {"model.embed_tokens.weight": _x((64, 128), 0),
         "model.layers.0.self_attn.q_proj.weight": _x((128, 128), 1),
         "model.layers.0.mlp.gate.weight": _x((G, 128), 2, np.float32),
         "model.layers.0.mlp.experts.gate_up_proj": _x((G, 64, 128), 3),
         "model.layers.0.input_layernorm.weight": np.ones(128, BF16)},
        {"model.layers.0.mlp.experts.down_proj": _x((G, 128, 32), 4),
         "model.layers.0.mlp.shared.w1.weight": _x((32, 128), 5, np.float16),
         "model.norm.weight": np.ones(128, BF16),
         "lm_head.weight": _x((64, 128), 6)},
    ]


CONFIG = {"architectures": ["TinyMoeForCausalLM"], "hidden_size": 128, "num_experts": G,
          "torch_dtype": "bfloat16"}


def _model_dir(path):
    path.mkdir()
    weight_map = {}
    for i, shard in enumerate(_shards()):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        lio.save(path / name, shard)
        weight_map.update({k: name for k in shard})
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return path


def _tensors(directory):
    out = {}
    for f in sorted(os.listdir(directory)):
        if f.endswith(".safetensors"):
            with SafetensorsFile(directory / f) as st:
                out.update({k: (st.label(k), st.info(k)[1], f) for k in st.keys()})
    return out


def test_model_directory_round_trip(tmp_path):
    src = _model_dir(tmp_path / "model")
    r = run("quantize", src, tmp_path / "q", "--format", "nvfp4")
    assert r.exit_code == 0, r.output
    q = tmp_path / "q"
    assert sorted(os.listdir(q)) == sorted(
        ["config.json", "hf_quant_config.json", "model-00001-of-00002.safetensors",
         "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json"])
    assert (q / "tokenizer.json").read_text() == '{"version": "1.0"}'
    arrays = _tensors(q)
    index = json.loads((q / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {k: v[2] for k, v in arrays.items()}
    assert index["metadata"]["total_size"] == sum(
        os.path.getsize(q / f) for f in set(index["weight_map"].values()))
    # ModelOpt names and dtypes; the exact amax is metadata, not an extra array
    w = "model.layers.0.self_attn.q_proj.weight"
    assert arrays[w][:2] == ("U8", (128, 64))
    assert arrays[w + "_scale"][:2] == ("F8_E4M3", (128, 8))
    assert arrays[w + "_scale_2"][:2] == ("F32", ())
    assert not any(k.endswith("_amax") for k in arrays)
    # expert stacks become one tensor per expert, in the shard of the stack
    for i in range(G):
        e = f"model.layers.0.mlp.experts.{i}.gate_up_proj"
        assert arrays[e][:3] == ("U8", (64, 64), "model-00001-of-00002.safetensors")
        assert arrays[f"model.layers.0.mlp.experts.{i}.down_proj"][:2] == ("U8", (128, 16))
    assert "model.layers.0.mlp.experts.gate_up_proj" not in arrays
    assert "expert stack model.layers.0.mlp.experts.gate_up_proj: 4 experts written as " \
           "model.layers.0.mlp.experts.{i}.gate_up_proj" in r.output
    # embeddings, lm_head, router gate and norms stay as they were
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight",
                 "model.norm.weight"):
        assert arrays[name][0] in ("BF16", "F32"), name
    hf = json.loads((q / "hf_quant_config.json").read_text())
    assert hf["producer"]["name"] == "lowprec_moe"
    assert hf["quantization"] == {
        "quant_algo": "W4A16_NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
        "exclude_modules": ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"]}
    config = json.loads((q / "config.json").read_text())
    qc = config.pop("quantization_config")
    assert config == CONFIG
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "W4A16_NVFP4"
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 16
    assert qc["ignore"] == hf["quantization"]["exclude_modules"]

    # back: same names, shapes and original dtypes; values those of lpm.dequantize
    r = run("dequantize", q, tmp_path / "dq")
    assert r.exit_code == 0, r.output
    dq = tmp_path / "dq"
    assert json.loads((dq / "config.json").read_text()) == CONFIG
    assert not (dq / "hf_quant_config.json").exists()
    back = {}
    for f in sorted(os.listdir(dq)):
        if f.endswith(".safetensors"):
            back.update(lio.load(dq / f))
    original = {k: v for shard in _shards() for k, v in shard.items()}
    assert sorted(back) == sorted(original)
    for name, x in original.items():
        assert back[name].dtype == x.dtype and back[name].shape == x.shape, name
    w = original["model.layers.0.mlp.experts.gate_up_proj"]
    want = np.stack([lpm.dequantize(lpm.quantize(w[i], "nvfp4"), dtype="bfloat16")
                     for i in range(G)])
    assert back["model.layers.0.mlp.experts.gate_up_proj"].tobytes() == want.tobytes()
    s = original["model.layers.0.mlp.shared.w1.weight"]
    assert back["model.layers.0.mlp.shared.w1.weight"].tobytes() == lpm.dequantize(
        lpm.quantize(s, "nvfp4"), dtype="float16").tobytes()
    assert back["lm_head.weight"].tobytes() == original["lm_head.weight"].tobytes()


def test_index_file_input_and_fused_experts(tmp_path):
    src = _model_dir(tmp_path / "model")
    r = run("quantize", src / "model.safetensors.index.json", tmp_path / "q", "--format",
            "nvfp4", "--experts", "fused", "--exclude", "*shared*")
    assert r.exit_code == 0, r.output
    assert "expert stack model.layers.0.mlp.experts.down_proj: kept fused" in r.output
    assert "model.layers.0.mlp.shared.w1.weight: excluded by --exclude" in r.output
    arrays = _tensors(tmp_path / "q")
    stack = "model.layers.0.mlp.experts.gate_up_proj"
    assert arrays[stack][:2] == ("U8", (G * 64, 64))
    assert arrays[stack + "_scale_2"][:2] == ("F32", (G,))  # one global scale per expert
    g = lio.load(tmp_path / "q" / "model-00001-of-00002.safetensors")[stack]
    assert isinstance(g, lpm.GroupedTensor) and g.splits == (64,) * G
    hf = json.loads((tmp_path / "q" / "hf_quant_config.json").read_text())
    assert "model.layers.0.mlp.shared.w1" in hf["quantization"]["exclude_modules"]


def test_compressed_tensors_layout(tmp_path):
    src = _model_dir(tmp_path / "model")
    r = run("quantize", src, tmp_path / "ct", "--format", "nvfp4", "--layout",
            "compressed-tensors")
    assert r.exit_code == 0, r.output
    arrays = _tensors(tmp_path / "ct")
    w = "model.layers.0.self_attn.q_proj.weight"
    assert arrays[w + "_packed"][:2] == ("U8", (128, 64))
    assert arrays[w + "_scale"][:2] == ("F8_E4M3", (128, 8))
    assert arrays[w + "_global_scale"][:2] == ("F32", (1,))
    assert w not in arrays and not (tmp_path / "ct" / "hf_quant_config.json").exists()
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == "nvfp4-pack-quantized" and qc["quantization_status"] == "compressed"
    weights = qc["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["type"], weights["strategy"], weights["group_size"]) \
        == (4, "float", "tensor_group", 16)
    assert "lm_head" in qc["ignore"]
    r = run("dequantize", tmp_path / "ct", tmp_path / "dq")
    assert r.exit_code == 0, r.output


def test_keys_name_a_default_excluded_tensor(tmp_path):
    lio.save(tmp_path / "m.safetensors", {"lm_head.weight": _x((32, 64), 0),
                                          "x.weight": _x((32, 64), 1)})
    r = run("quantize", tmp_path / "m.safetensors", tmp_path / "q.safetensors", "--format",
            "mxfp8")
    assert r.exit_code == 0 and "lm_head.weight: excluded by default" in r.output
    r = run("quantize", tmp_path / "m.safetensors", tmp_path / "q2.safetensors", "--format",
            "mxfp8", "--keys", "lm_head.*")
    assert r.exit_code == 0, r.output
    assert isinstance(lio.load(tmp_path / "q2.safetensors")["lm_head.weight"], lpm.QuantizedTensor)


def test_layout_option_errors(tmp_path):
    lio.save(tmp_path / "m.safetensors", {"x.weight": _x((32, 64), 1)})
    for args, match in ((["--columnwise"], "needs layout='lowprec'"),
                        (["--format", "mxfp8", "--layout", "compressed-tensors"], "nvfp4 only")):
        fmt = [] if "--format" in args else ["--format", "nvfp4"]
        r = run("quantize", tmp_path / "m.safetensors", tmp_path / "q.safetensors", *fmt, *args)
        assert r.exit_code == 2 and match in r.stderr, r.output


def test_directory_input_needs_directory_output(tmp_path):
    src = _model_dir(tmp_path / "model")
    r = run("quantize", src, tmp_path / "q.safetensors", "--format", "nvfp4")
    assert r.exit_code == 1 and "gives a directory output" in r.stderr


def test_dequantize_npy_of_bfloat16_is_refused_with_a_clear_message(tmp_path):
    lio.save(tmp_path / "m.safetensors", {"x": _x((32, 64), 1)})
    assert run("quantize", tmp_path / "m.safetensors", tmp_path / "q.safetensors", "--format",
               "nvfp4").exit_code == 0
    r = run("dequantize", tmp_path / "q.safetensors", tmp_path / "x.npy")
    assert r.exit_code == 1 and "NumPy cannot read bfloat16" in r.stderr
    r = run("dequantize", tmp_path / "q.safetensors", tmp_path / "x.npy", "--dtype", "float16")
    assert r.exit_code == 0
    assert np.load(tmp_path / "x.npy").dtype == np.float16


# ------------------------------------------------------------------ progress
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_byte_progress_lines_when_not_on_a_terminal():
    out, clock = io.StringIO(), _Clock()
    p = ByteProgress(out, interval=5.0, tty=False, clock=clock)
    p.start(1000 * 10**6, "quantizing")
    clock.t = 1.0
    p.advance(100 * 10**6, "a")
    assert out.getvalue() == ""  # not yet an interval
    clock.t = 5.0
    p.advance(150 * 10**6, "b")
    clock.t = 10.0
    p.advance(250 * 10**6, "c")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("quantizing: 238.42 MiB / 953.67 MiB (25%), 50.0 MB/s, ETA 0:15")
    assert "(50%), 50.0 MB/s, ETA 0:10" in lines[1]
    p.finish()
    assert out.getvalue().splitlines()[-1] == "quantizing: 476.84 MiB in 10.0 s (50.0 MB/s)"


def test_byte_progress_short_job_is_silent_and_tty_redraws():
    out = io.StringIO()
    p = ByteProgress(out, tty=False)
    p.start(10, "x")
    p.advance(10)
    p.finish()
    assert out.getvalue() == ""
    out, clock = io.StringIO(), _Clock()
    p = ByteProgress(out, tty=True, clock=clock)
    p.start(100, "x")
    clock.t = 1.0
    p.advance(50, "w")
    p.finish()
    assert out.getvalue().count("\r") >= 2 and out.getvalue().endswith("(0.0 MB/s)\n")


def test_quiet_and_progress_through_the_library(tmp_path):
    lio.save(tmp_path / "m.safetensors", {"x": _x((32, 64), 1)})
    seen = []

    class Record:
        def start(self, total, label):
            seen.append(("start", total, label))

        def advance(self, nbytes, name=""):
            seen.append(("advance", nbytes, name))

        def finish(self):
            seen.append(("finish",))

    convert.quantize_file(tmp_path / "m.safetensors", tmp_path / "q.safetensors", "nvfp4",
                          progress=Record())
    assert seen == [("start", 32 * 64 * 2, "quantizing"), ("advance", 32 * 64 * 2, "x"),
                    ("finish",)]
    r = run("quantize", tmp_path / "m.safetensors", tmp_path / "q2.safetensors", "--format",
            "nvfp4", "--quiet")
    assert r.exit_code == 0 and r.stderr == ""


def test_jobs_do_not_change_the_output(tmp_path):
    src = _model_dir(tmp_path / "model")
    outs = []
    for jobs in (1, 3):
        out = tmp_path / f"q{jobs}"
        convert.quantize_file(src, out, "nvfp4", jobs=jobs)
        outs.append({f: (out / f).read_bytes() for f in sorted(os.listdir(out))})
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="jobs=0 must be a positive int"):
        convert.quantize_file(src, tmp_path / "q0", "nvfp4", jobs=0)


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32])
def test_non_finite_check_on_raw_bits(dtype):
    from lowprec_moe.io._shard import all_finite

    x = _x((8, 32), 0, dtype)
    assert all_finite(x)
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        y[7, 31] = bad
        assert not all_finite(y)
    big = np.full((3, 1 << 23), 65504 if dtype is np.float16 else 3e38, dtype)
    assert all_finite(big)
