"""lowprec_moe.torch: the nn.Modules against the library's explicit forward / backward (bit for
bit) and against torch autograd on the dequantized operands; CPU always, CUDA marked gpu."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowprec_moe as lpm  # noqa: E402
import lowprec_moe.torch as lpt  # noqa: E402
from lowprec_moe import interop  # noqa: E402


def _cuda_ok() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


CUDA_OK = _cuda_ok()
requires_cuda = pytest.mark.skipif(not CUDA_OK, reason="needs torch with CUDA, CuPy and a GPU")

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, requires_cuda])]

RECIPES = {
    "bf16": lpm.Recipe.bf16(),
    "mxfp8": lpm.Recipe.mxfp8(),
    "mxfp8_hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"),
    "nvfp4": lpm.Recipe.nvfp4(),
    "nvfp4_rowscaled": lpm.Recipe.nvfp4(row_scaled_activation=True),
}
SPLITS = [40, 0, 88]          # G = 3, M = 128 (128 keeps every NVFP4 columnwise block full)


def _host(t):
    """float32 NumPy copy of a torch tensor (tests only)."""
    return t.detach().float().cpu().numpy()


def _lib(t):
    """The library array of a torch tensor (shares memory)."""
    return None if t is None else interop.to_xp(t.detach())


def _to_host_np(a):
    return None if a is None else _host(interop.to_torch(a))


def _assert_same(actual, expected, what):
    a, e = _host(actual), _to_host_np(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    np.testing.assert_array_equal(a, e, err_msg=what)


def _inputs(device, m=128, k=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    probs = torch.rand(m, generator=g).to(device)
    return x, probs


# ============================================================================================
# splits


def test_host_splits_forms():
    assert lpt.host_splits([1, 2]) == (1, 2)
    assert lpt.host_splits((3, 0)) == (3, 0)
    assert lpt.host_splits(np.array([4, 5], dtype=np.int32)) == (4, 5)
    assert lpt.host_splits(torch.tensor([6, 7])) == (6, 7)
    assert all(type(v) is int for v in lpt.host_splits(torch.tensor([6, 7], dtype=torch.int32)))


@pytest.mark.parametrize("bad, exc", [(torch.tensor([1.0, 2.0]), TypeError),
                                      (torch.tensor([[1, 2]]), TypeError),
                                      ("12", TypeError)])
def test_host_splits_rejects(bad, exc):
    with pytest.raises(exc, match="splits"):
        lpt.host_splits(bad)


def test_splits_sum_checked():
    lin = lpt.GroupedLinear(2, 64, 32)
    with pytest.raises(ValueError, match="sum to"):
        lin(torch.randn(10, 64), [3, 3])


def test_rejects_numpy_x():
    lin = lpt.GroupedLinear(2, 64, 32)
    with pytest.raises(TypeError, match="torch.Tensor or a lowprec_moe.GroupedTensor"):
        lin(np.zeros((4, 64), np.float32), [2, 2])


# ============================================================================================
# against the explicit API, bit for bit


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(RECIPES))
def test_linear_matches_explicit_api(device, name):
    recipe = RECIPES[name]
    torch.manual_seed(1)
    dtype = torch.bfloat16
    lin = lpt.GroupedLinear(3, 64, 32, recipe=recipe, device=device, dtype=dtype)
    x, probs = _inputs(device)
    x.requires_grad_(True)
    probs.requires_grad_(True)
    splits_arg = torch.tensor(SPLITS, device=device)
    y = lin(x, splits_arg, probs)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(device, y.dtype)
    y.backward(dy)
    assert lin.step == 1

    with interop.torch_stream(device):
        y_ref, ctx = lpm.grouped_linear_forward(_lib(x), SPLITS, _lib(lin.weight), _lib(lin.bias),
                                                recipe=recipe, probs=_lib(probs), seed=0)
        g = lpm.grouped_linear_backward(_lib(dy), ctx)
    _assert_same(y, y_ref, "y")
    _assert_same(x.grad, g.dx, "dx")
    _assert_same(lin.weight.grad, g.dweight, "dweight")
    _assert_same(lin.bias.grad, g.dbias, "dbias")
    _assert_same(probs.grad, g.dprobs, "dprobs")
    assert lin.weight.grad.dtype == lin.weight.dtype and x.grad.dtype == x.dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(RECIPES))
def test_mlp_matches_explicit_api(device, name):
    recipe = RECIPES[name]
    torch.manual_seed(3)
    mlp = lpt.GroupedMLP(3, 64, 64, recipe=recipe, device=device, dtype=torch.bfloat16)
    x, probs = _inputs(device, seed=4)
    x.requires_grad_(True)
    probs.requires_grad_(True)
    y = mlp(x, torch.tensor(SPLITS, device=device), probs)  # CUDA splits stay on the device
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(device, y.dtype)
    y.backward(dy)

    with interop.torch_stream(device):
        y_ref, ctx = lpm.grouped_mlp_forward(
            _lib(x), SPLITS, _lib(mlp.fc1_weight), _lib(mlp.fc2_weight), _lib(mlp.fc1_bias),
            _lib(mlp.fc2_bias), probs=_lib(probs), recipe=recipe, seed=0)
        g = lpm.grouped_mlp_backward(_lib(dy), ctx)
    _assert_same(y, y_ref, "y")
    _assert_same(x.grad, g.dx, "dx")
    _assert_same(mlp.fc1_weight.grad, g.dfc1_weight, "dfc1_weight")
    _assert_same(mlp.fc2_weight.grad, g.dfc2_weight, "dfc2_weight")
    _assert_same(mlp.fc1_bias.grad, g.dfc1_bias, "dfc1_bias")
    _assert_same(mlp.fc2_bias.grad, g.dfc2_bias, "dfc2_bias")
    _assert_same(probs.grad, g.dprobs, "dprobs")


@pytest.mark.parametrize("device", DEVICES)
def test_step_counter_seeds_stochastic_rounding(device):
    """Two backward passes draw different SR bits; the second equals the explicit API's seed=1."""
    recipe = lpm.Recipe.nvfp4()
    torch.manual_seed(6)
    lin = lpt.GroupedLinear(3, 64, 32, bias=False, recipe=recipe, device=device,
                            dtype=torch.bfloat16)
    x, _ = _inputs(device, seed=7)
    x.requires_grad_(True)
    dy = torch.randn(128, 32, generator=torch.Generator().manual_seed(8)).to(device,
                                                                             torch.bfloat16)
    grads = []
    for _ in range(2):
        x.grad = None
        lin(x, SPLITS).backward(dy)
        grads.append(x.grad.clone())
    assert lin.step == 2
    assert not torch.equal(grads[0], grads[1])
    with interop.torch_stream(device):
        _, ctx = lpm.grouped_linear_forward(_lib(x), SPLITS, _lib(lin.weight), recipe=recipe,
                                            seed=1)
        g = lpm.grouped_linear_backward(_lib(dy), ctx)
    _assert_same(grads[1], g.dx, "dx at step 1")


# ============================================================================================
# against torch autograd on the dequantized operands


def _dq(t, direction):
    return interop.to_torch(t.dequantize(direction, "float32"))


def _linear_ref(x, w, splits):
    """Per-expert ``x_g @ w_g^T`` in float32 with torch ops (autograd-capable)."""
    outs, start = [], 0
    for g, n in enumerate(splits):
        outs.append(x[start:start + n] @ w[g].T)
        start += n
    return torch.cat(outs)


# NVFP4 without RHT / SR: every operand is a deterministic quantization the test can rebuild
REF_RECIPES = {
    "bf16": lpm.Recipe.bf16(),
    "mxfp8": lpm.Recipe.mxfp8(),
    "mxfp8_hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"),
    "nvfp4": lpm.Recipe.nvfp4(rht=False, stochastic_rounding=False),
    "nvfp4_1d": lpm.Recipe.nvfp4(rht=False, stochastic_rounding=False, weight_2d=False),
    "nvfp4_rowscaled": lpm.Recipe.nvfp4(row_scaled_activation=True),
}


def _operands(recipe, x, w, dy, splits):
    """Dequantized fprop / dgrad / wgrad operands (float32 torch tensors) as NUMERICS §7 lists."""
    g_, n, k = w.shape
    if not recipe.quantized:
        f = [t.detach().float() for t in (x, w, dy)]
        return dict(x_row=f[0], w_row=f[1], dy_row=f[2], w_col=f[1], dy_col=f[2], x_col=f[0])
    xa, wa, dya = _lib(x), _lib(w).reshape(g_ * n, k), _lib(dy)
    fmt = recipe.format
    if fmt == "mxfp8":
        xq = lpm.GroupedTensor.quantize(xa, splits, fmt, columnwise=True)
        wq = lpm.GroupedTensor.quantize(wa, [n] * g_, fmt, columnwise=True,
                                        block_2d=recipe.weight_2d)
        dq = lpm.GroupedTensor.quantize(dya, splits, fmt, columnwise=True,
                                        fp8_dtype=recipe.dy_fp8_dtype)
    else:
        xq = lpm.GroupedTensor.quantize(xa, splits, fmt, columnwise=True,
                                        row_scaled=recipe.row_scaled_activation)
        wq = lpm.GroupedTensor.quantize(wa, [n] * g_, fmt, columnwise=True,
                                        block_2d=recipe.weight_2d)
        dq = lpm.GroupedTensor.quantize(dya, splits, fmt, columnwise=True)
    return dict(x_row=_dq(xq, "rowwise"), x_col=_dq(xq, "columnwise"),
                w_row=_dq(wq, "rowwise").reshape(g_, n, k),
                w_col=_dq(wq, "columnwise").reshape(g_, n, k),
                dy_row=_dq(dq, "rowwise"), dy_col=_dq(dq, "columnwise"))


def _close(actual, expected, what, rel=1e-2):
    a, e = actual.detach().float(), expected.detach().float()
    scale = float(e.abs().max()) or 1.0
    err = float((a - e).abs().max())
    assert err <= rel * scale, f"{what}: max |err| {err:.3e} > {rel} * {scale:.3e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(REF_RECIPES))
def test_linear_against_torch_autograd(device, name):
    recipe = REF_RECIPES[name]
    torch.manual_seed(9)
    lin = lpt.GroupedLinear(3, 64, 32, bias=False, recipe=recipe, device=device,
                            dtype=torch.bfloat16)
    x, _ = _inputs(device, seed=10)
    x.requires_grad_(True)
    y = lin(x, SPLITS)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(11)).to(device, y.dtype)
    y.backward(dy)

    ops = _operands(recipe, x, lin.weight, dy, SPLITS)
    _close(y, _linear_ref(ops["x_row"], ops["w_row"], SPLITS), "y")
    # dgrad: dy rowwise and W columnwise; wgrad: dy columnwise and x columnwise (NUMERICS §7)
    xl = ops["x_row"].clone().requires_grad_(True)
    (dx_ref,) = torch.autograd.grad(_linear_ref(xl, ops["w_col"], SPLITS), xl, ops["dy_row"])
    wl = ops["w_row"].clone().requires_grad_(True)
    (dw_ref,) = torch.autograd.grad(_linear_ref(ops["x_col"], wl, SPLITS), wl, ops["dy_col"])
    _close(x.grad, dx_ref, "dx")
    _close(lin.weight.grad, dw_ref, "dweight")


def _swiglu_mlp_ref(x, w1, w2, b1, b2, probs, splits):
    """fc2(silu(gate) * linear * probs) + b2 * probs per expert, in torch (gate rows first)."""
    outs, start = [], 0
    for g, n in enumerate(splits):
        xs, ps = x[start:start + n], probs[start:start + n, None]
        h = xs @ w1[g].T + b1[g]
        f = h.shape[1] // 2
        z = torch.nn.functional.silu(h[:, :f]) * h[:, f:] * ps
        outs.append(z @ w2[g].T + b2[g] * ps)
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize("device", DEVICES)
def test_mlp_bf16_against_torch_autograd(device):
    torch.manual_seed(12)
    mlp = lpt.GroupedMLP(3, 64, 64, device=device, dtype=torch.float32)
    x, probs = _inputs(device, dtype=torch.float32, seed=13)
    x.requires_grad_(True)
    probs.requires_grad_(True)
    y = mlp(x, SPLITS, probs)
    y.square().sum().backward()

    ref_params = [p.detach().clone().requires_grad_(True)
                  for p in (mlp.fc1_weight, mlp.fc2_weight, mlp.fc1_bias, mlp.fc2_bias)]
    xr = x.detach().clone().requires_grad_(True)
    pr = probs.detach().clone().requires_grad_(True)
    yr = _swiglu_mlp_ref(xr, *ref_params, pr, SPLITS)
    yr.square().sum().backward()
    _close(y, yr, "y", rel=1e-4)
    _close(x.grad, xr.grad, "dx", rel=1e-4)
    _close(probs.grad, pr.grad, "dprobs", rel=1e-4)
    for p, r, what in zip((mlp.fc1_weight, mlp.fc2_weight, mlp.fc1_bias, mlp.fc2_bias),
                          ref_params, ("dfc1_weight", "dfc2_weight", "dfc1_bias", "dfc2_bias")):
        _close(p.grad, r.grad, what, rel=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, rel", [("mxfp8", 0.1), ("nvfp4", 0.3)])
def test_mlp_quantized_near_float32(device, name, rel):
    """A coarse bound: the quantized MLP's output stays near the float32 torch reference."""
    torch.manual_seed(14)
    mlp = lpt.GroupedMLP(3, 64, 64, recipe=RECIPES[name], device=device)
    x, probs = _inputs(device, seed=15)
    y = mlp(x, SPLITS, probs)
    params = [p.detach() for p in (mlp.fc1_weight, mlp.fc2_weight, mlp.fc1_bias, mlp.fc2_bias)]
    yr = _swiglu_mlp_ref(x.float(), *params, probs, SPLITS)
    _close(y, yr, "y", rel=rel)


# ============================================================================================
# parameters, dtypes, frozen weights, wire inputs, no_grad, compile


def test_float32_master_weights_with_bf16_activations():
    """bf16 recipe: float32 parameters are cast to x's dtype by torch; grads stay float32."""
    torch.manual_seed(16)
    lin = lpt.GroupedLinear(3, 64, 32)
    x, _ = _inputs("cpu", seed=17)
    y = lin(x, SPLITS)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    ref = _linear_ref(x.float(), lin.weight.detach().bfloat16().float(), SPLITS)
    _close(y, ref + lin.bias.detach().bfloat16().float().repeat_interleave(
        torch.tensor(SPLITS), dim=0), "y")


@pytest.mark.parametrize("device", DEVICES)
def test_frozen_weights_skip_their_gradients(device):
    torch.manual_seed(18)
    mlp = lpt.GroupedMLP(3, 64, 64, recipe=RECIPES["mxfp8"], device=device)
    mlp.fc1_weight.requires_grad_(False)
    mlp.fc1_bias.requires_grad_(False)
    x, probs = _inputs(device, seed=19)
    x.requires_grad_(True)
    mlp(x, SPLITS, probs).float().sum().backward()
    assert mlp.fc1_weight.grad is None and mlp.fc1_bias.grad is None
    assert mlp.fc2_weight.grad is not None and x.grad is not None

    mlp.zero_grad(set_to_none=True)
    mlp.requires_grad_(False)
    x.grad = None
    mlp(x, SPLITS, probs).float().sum().backward()
    assert x.grad is not None and all(p.grad is None for p in mlp.parameters())


def test_no_grad_forward_keeps_no_context():
    torch.manual_seed(20)
    lin = lpt.GroupedLinear(3, 64, 32, recipe=RECIPES["nvfp4"])
    x, _ = _inputs("cpu", seed=21)
    x.requires_grad_(True)
    with torch.no_grad():
        y = lin(x, SPLITS)
    assert not y.requires_grad and y.grad_fn is None
    with torch.enable_grad():
        y_grad = lin(x, SPLITS)
    torch.testing.assert_close(y, y_grad.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", ["linear", "mlp"])
def test_wire_mxfp8_input(device, layer):
    """Pre-quantized MXFP8 tokens from torch uint8 tensors equal the dequantized-bf16 path."""
    recipe = RECIPES["mxfp8"]
    torch.manual_seed(22)
    mod = (lpt.GroupedLinear(3, 64, 32, recipe=recipe, device=device) if layer == "linear"
           else lpt.GroupedMLP(3, 64, 64, recipe=recipe, device=device))
    x, probs = _inputs(device, seed=23)
    with interop.torch_stream(device):
        q = lpm.GroupedTensor.quantize(_lib(x), SPLITS, "mxfp8")
        x_hat = interop.to_torch(q.dequantize("rowwise", "bfloat16"))
    data, scale = interop.to_torch(q.rowwise_data), interop.to_torch(q.rowwise_scale)
    wire = lpt.mxfp8_wire(data, scale, torch.tensor(SPLITS))
    ptr = (wire.rowwise_data.data.ptr if device == "cuda"
           else wire.rowwise_data.ctypes.data)
    assert ptr == data.data_ptr()

    probs.requires_grad_(True)
    y = mod(wire, None, probs)
    y.float().sum().backward()
    grads_wire = [p.grad.clone() for p in mod.parameters()] + [probs.grad.clone()]
    mod.zero_grad()
    probs.grad = None
    y_ref = mod(x_hat, SPLITS, probs)
    y_ref.float().sum().backward()
    grads_ref = [p.grad for p in mod.parameters()] + [probs.grad]
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    for a, b in zip(grads_wire, grads_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_wire_rejects_non_uint8():
    with pytest.raises(TypeError, match="torch.uint8"):
        lpt.mxfp8_wire(torch.zeros(4, 32), torch.zeros(4, 1, dtype=torch.uint8), [4])


def test_devices_must_agree():
    lin = lpt.GroupedLinear(3, 64, 32)
    x, probs = _inputs("cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="share a device"):
        lin(x, SPLITS, probs.to("meta"))


def test_module_repr_and_validation():
    m = lpt.GroupedMLP(2, 64, 32, activation="srelu", recipe=RECIPES["mxfp8"], bias=False)
    assert m.fc1_weight.shape == (2, 32, 64) and "srelu" in repr(m) and "mxfp8" in repr(m)
    with pytest.raises(ValueError, match="num_experts"):
        lpt.GroupedLinear(0, 64, 32)
    with pytest.raises(TypeError, match="Recipe"):
        lpt.GroupedLinear(2, 64, 32, recipe="nvfp4")
    with pytest.raises(ValueError, match="activation"):
        lpt.GroupedMLP(2, 64, 32, activation="gelu")


def test_torch_compile_graph_breaks_at_the_layer():
    """The layers are opaque to Dynamo: compiling a model around one runs, with a break there."""
    torch.manual_seed(24)
    mlp = lpt.GroupedMLP(3, 64, 64, recipe=RECIPES["mxfp8"])
    proj = torch.nn.Linear(64, 64)

    def f(x, probs):
        return proj(mlp(torch.tanh(x), SPLITS, probs).float()).sum()

    x, probs = _inputs("cpu", seed=25)
    expected = f(x, probs)
    explain = torch._dynamo.explain(f)(x, probs)
    assert explain.graph_break_count >= 1
    compiled = torch.compile(f, backend="eager")
    torch.testing.assert_close(compiled(x, probs), expected, rtol=0, atol=0)
