"""CuPy launcher of the grouped GEMM kernels (``raw_kernels/grouped_gemm_*.cu``).

Entry point: :func:`grouped_gemm` ``(problem)`` for a validated
:class:`lowprec_moe.gemm.GemmProblem` whose arrays are CuPy arrays. One kernel launch computes
every expert.

How a call is laid out
----------------------
The kernels see one canonical GEMM per expert, ``out[r, c] = sum_k A[r, k] * B[c, k]``, with each
operand either *K-major* (element ``(r, k)`` at ``off + r*ld + k*size``) or *MN-major* (element
``(r, k)`` at ``off + k*ld + r*size``). This module turns the three GEMMs into that form:

=======  ==========================  ==============================  ==========================
mode     A (rows r)                  B (rows c)                      contraction k
=======  ==========================  ==============================  ==========================
fprop    x rows, K-major             W_g rows, K-major               K
dgrad    dy rows, K-major            W_g^T: MN-major (hp, MXFP8      N
                                     columnwise) / K-major (NVFP4
                                     columnwise, stored transposed)
wgrad    dy^T: MN-major (hp, MXFP8)  x^T: same as A                  expert's tokens (padded to
         / K-major (NVFP4)                                           the block when quantized)
=======  ==========================  ==============================  ==========================

and gives the kernel two small tables: the tile table ``int32 [entries, 2] = (expert, row
tile)`` and the descriptor table ``int64 [G, 16]`` (byte offsets / leading dimensions of both
operands and their scales, valid rows, contraction length, output / amax / bias / probs bases;
layout in ``raw_kernels/gemm/grouped_gemm_base.cuh``). With host splits they are built on the
host and uploaded once per content (:mod:`lowprec_moe.backends.cupy.tables`); with device splits
they are built on the device for every call (:mod:`.device_splits`, two launches), from
coefficients kept for the life of the process so that a captured CUDA graph can replay them.

Which kernel runs is decided by :mod:`.select` over the config tables of :mod:`.sm90` and
:mod:`.generic`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from lowprec_moe import config, kernels, quant_formats
from lowprec_moe.backends.cupy import tables
from lowprec_moe.backends.cupy import splits_kernels as SK
from lowprec_moe.backends.cupy.gemm import device_splits as DS
from lowprec_moe.backends.cupy.gemm.balance import ragged_tile_list, ragged_tile_table
from lowprec_moe.backends.cupy.gemm.compile import kernel_function
from lowprec_moe.backends.cupy.gemm.plan import MMA_PARAMS, OUT_TYPES, SIMT_PARAMS, _cdiv, _flat_amax, descriptors, plan, tile_table
from lowprec_moe.backends.cupy.gemm.ranges import mx_range_words
from lowprec_moe.backends.cupy.gemm.select import choose_kernel
from lowprec_moe.backends.cupy.gemm.tma_rules import (_pair_geom, _pair_maps, _ptr, _tma_maps,
                                                      tma_geometry)

__all__ = ["grouped_gemm", "kernel_info"]

_MAX_CACHED = 64
_lock = threading.Lock()
_dummies: dict = {}
_smem_set: set = set()


# ============================================================================================
# Launch


def _device_tables(tiles: np.ndarray, desc: np.ndarray):
    """Device copies of the tile and descriptor tables (cached by content)."""
    (d_tiles,) = tables.upload(tiles if tiles.size else np.zeros((1, 2), np.int32),
                               dtype=np.int32)
    (d_desc,) = tables.upload(desc)
    return d_tiles, d_desc


def _dummy():
    import cupy as cp

    dev = int(cp.cuda.runtime.getDevice())
    d = _dummies.get(dev)
    if d is None:
        d = _dummies[dev] = cp.zeros(16, dtype=cp.float32)
    return d


def _out_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _operand_arrays(p) -> tuple:
    """(a_data, a_scale, a_amax, b_data, b_scale, b_amax) of a problem: the arrays plan() puts
    into its operands (None where absent)."""
    if p.fmt == "hp":
        return p.a, None, None, p.b, None, None
    copies = {"fprop": ("rowwise", "rowwise"), "dgrad": ("rowwise", "columnwise"),
              "wgrad": ("columnwise", "columnwise")}[p.mode]
    out = []
    for gt, copy in zip((p.a, p.b), copies):
        amax = None
        if quant_formats.get(gt.format).has_amax:
            amax = _flat_amax(gt.amax_rowwise if copy == "rowwise" else gt.amax_columnwise)
        out += [getattr(gt, f"{copy}_data"), getattr(gt, f"{copy}_scale"), amax]
    return tuple(out)


def _signature(p, arrays, kernel: str) -> tuple:
    """Everything the launch configuration depends on, apart from the array contents: the cache
    key of the prepared tables (pointer alignment residues included, pointers themselves not)."""
    def gt_sig(x):
        if not hasattr(x, "format"):
            return (tuple(x.shape), str(x.dtype))
        if x.splits_on_device:  # the layout depends on M and G only (values not read)
            return (x.format, x.fp8_dtype, bool(x.row_scaled), tuple(x.shape), "device",
                    len(x.splits))
        cw = x.columnwise_data_offsets
        return (x.format, x.fp8_dtype, bool(x.row_scaled), tuple(x.shape), tuple(x.splits),
                None if cw is None else (int(cw[-1]), len(cw)))

    residues = tuple(None if arr is None else int(arr.data.ptr) % 16 for arr in arrays)
    import cupy as cp

    return (int(cp.cuda.runtime.getDevice()), p.mode, p.fmt, p.hp_dtype, p.splits, p.n, p.k,
            bool(p.accumulate), kernel, p.out_dtype, p.bias is not None,
            None if p.out is None else _ptr(p.out) % 16,
            gt_sig(p.a), gt_sig(p.b), residues)


_prepared: OrderedDict = OrderedDict()
#: Launch configurations of device-splits problems, never evicted: a CUDA graph captured from
#: such a call keeps reading their device tables at every replay.
_prepared_device: dict = {}


def _lookup(key):
    """A prepared launch by signature (LRU), or None."""
    with _lock:
        hit = _prepared.get(key)
        if hit is not None:
            _prepared.move_to_end(key)
        return hit


def _remember(key, val):
    with _lock:
        _prepared[key] = val
        while len(_prepared) > _MAX_CACHED:
            _prepared.popitem(last=False)
    return val


def _prepare(p, arrays, kernel: str):
    """Launch configuration and device tables of a problem, cached by its signature."""
    key = _signature(p, arrays, kernel)
    hit = _lookup(key)
    if hit is not None:
        return hit
    pl = plan(p)
    choice = choose_kernel(p, pl, kernel=kernel)
    launch = choice.config
    include = pl.rows > 0
    if pl.zero_if_empty and p.accumulate:
        include &= pl.length > 0
    n_col_tiles = _cdiv(pl.n_cols, launch.bn)
    desc = descriptors(pl)
    if launch.ragged:  # a balanced list of single tiles (entries of CTA b: b, b + cap, ...)
        tiles = ragged_tile_table(
            ragged_tile_list(pl.rows, pl.length, include, launch.bm, n_col_tiles,
                             choice.grid_cap),
            choice.grid_cap, desc, launch.bm, launch.bn, pl.n_cols, n_col_tiles)
        grid = tiles.shape[0]
    else:
        tiles = tile_table(pl.rows, include, launch.bm, pl.length)
        grid = tiles.shape[0] * n_col_tiles
    if grid >= 2**31:
        raise ValueError(f"problem too large: {grid} CTAs")
    d_tiles, d_desc = _device_tables(tiles, desc) if grid else (None, None)
    a, b = pl.a, pl.b
    if launch.simt:
        modes = ((a.ek, int(a.mn)), (b.ek, int(b.mn)))
    else:
        modes = ((launch.chunk, int(a.e5m2)), (launch.chunk, int(b.e5m2)))
    tma_geom = tma_geometry(pl) if launch.tma else None
    pair = launch.loader == "rowpair_tma"
    val = dict(launch=launch, grid_cap=choice.grid_cap, tiles=d_tiles, desc=d_desc, n_col_tiles=n_col_tiles,
               tma_geom=tma_geom, pair_geom=_pair_geom(pl) if pair else None,
               rows_max=int(pl.rows.max()) if len(pl.rows) else 0,
               mn=(bool(a.mn), bool(b.mn)), num_experts=len(pl.rows),
               grid=grid, n_cols=pl.n_cols, modes=modes, a_vec=int(a.amax_vec),
               b_vec=int(b.amax_vec), zero_if_empty=int(pl.zero_if_empty))
    return _remember(key, val)


def _row_block(p) -> int:
    """Rows per block of the operands' per-expert storage (quantized columnwise copies are
    padded to it): the format's block for quantized problems, 0 (no blocks) otherwise."""
    return 0 if p.fmt == "hp" else quant_formats.get(p.fmt).block


def _device_splits_config(p, kernel: str):
    """``(plan, probes, config)`` of a device-splits problem: the plan of an even split of M,
    the ``(problem, plan)`` of every probe split, and the kernel config ranked on the even
    split among those that compute every probe. Raises ``NotImplementedError`` for bf16 / fp16
    token rows the device-split kernels cannot address."""
    g, m = p.num_groups, p.m_total
    p_even = DS.nominal_problem(p, [m // g] * (g - 1) + [m - (g - 1) * (m // g)])
    pl = plan(p_even)
    if p.fmt == "hp":
        token_ops = (pl.a, pl.b) if p.mode == "wgrad" else (pl.a,)
        if any(int(op.ld[0]) % 16 or _ptr(op.data) % 16 for op in token_ops):
            raise NotImplementedError("device splits need token rows of whole 16-byte chunks "
                                      "(row bytes and the array's address multiples of 16)")
    probes = DS.probe_plans(p)
    return pl, probes, choose_kernel(p_even, pl, kernel=kernel, probes=probes).config


def _prepare_device_splits(p, arrays, kernel: str):
    """Launch configuration of a problem with device splits, cached by its signature: the
    kernel config (ranked on an even split of M among the configs that compute every probe
    split; every config gives the same bits, NUMERICS §7.5), the affine descriptor
    coefficients and, for wgrad,
    the tile table (module :mod:`.device_splits`)."""
    g, m = p.num_groups, p.m_total
    key = (g,) + _signature(p, arrays, kernel)  # (p.splits is None: M from the shapes)
    with _lock:
        hit = _prepared_device.get(key)
    if hit is not None:
        return hit
    pl, probes, launch = _device_splits_config(p, kernel)
    a, b = pl.a, pl.b
    block = _row_block(p)
    # the solve plans the same probe splits: reuse their plans
    planned = {tuple(q.splits): ql for q, ql in probes}

    def desc_of(s):
        ql = planned.get(tuple(s))
        return descriptors(ql if ql is not None else plan(DS.nominal_problem(p, s)))

    static, coef = DS.affine_descriptors(desc_of, g, m, block)
    n_col_tiles = _cdiv(pl.n_cols, launch.bn)
    if p.mode == "wgrad":  # one row tile per bm output rows of every expert, whatever the splits
        host_tiles = tile_table(pl.rows, np.ones(g, bool), launch.bm)
        (tiles,) = tables.upload(host_tiles, dtype=np.int32)
        entries = host_tiles.shape[0]
    else:
        tiles = None
        entries = DS.max_row_tiles(m, g, launch.bm)
    grid = entries * n_col_tiles
    if grid >= 2**31:
        raise ValueError(f"problem too large: {grid} CTAs")
    coefs = tables.upload(static, coef)
    if launch.simt:
        modes = ((a.ek, int(a.mn)), (b.ek, int(b.mn)))
    else:
        modes = ((launch.chunk, int(a.e5m2)), (launch.chunk, int(b.e5m2)))
    # the range words of the warp-specialised MXFP8 kernels cover an expert's output rows: up
    # to M of them when the experts split M, N each in wgrad
    val = dict(launch=launch, grid_cap=0, tiles=tiles, desc=None, coefs=coefs, block=block,
               n_col_tiles=n_col_tiles, tma_geom=tma_geometry(pl) if launch.tma else None,
               pair_geom=None, rows_max=m if tiles is None else int(pl.rows.max()),
               # an expert may hold all M rows, a typical one twice its share at most: the
               # range kernel's grid covers that and strides over the rest
               range_grid_rows=max(pl.n_cols, 2 * _cdiv(m, g)) if tiles is None else None,
               mn=(bool(a.mn), bool(b.mn)), num_experts=g, grid=grid, n_cols=pl.n_cols,
               modes=modes, a_vec=int(a.amax_vec), b_vec=int(b.amax_vec),
               zero_if_empty=int(pl.zero_if_empty))
    with _lock:
        return _prepared_device.setdefault(key, val)


def _device_tables_of_call(p, prep):
    """The prepared launch with this call's descriptor (and M-grouped tile) table, built on the
    device from ``p.device_splits`` in two launches (``raw_kernels/layouts/splits.cu``; NumPy
    twins in :mod:`.device_splits`); nothing is read back."""
    bm, block = prep["launch"].bm, prep["block"]
    tabs = SK.offsets(p.device_splits, p.m_total, bm, *((block,) if block else ()))
    row_off, tile_off = tabs[0], tabs[1]
    blk_off = tabs[2] if block else None
    m_grouped = prep["tiles"] is None
    desc, tiles = SK.gemm_tables(row_off, tile_off, p.m_total, *prep["coefs"], bm,
                                 DS.max_row_tiles(p.m_total, p.num_groups, bm) if m_grouped
                                 else None, blk_off=blk_off)
    call = dict(prep)
    call["desc"] = desc
    if m_grouped:
        call["tiles"] = tiles
    return call


def _range_words(prep, a_scale, b_scale):
    """The range kernel's words and out-of-window flag for a prepared warp-specialised MXFP8
    launch (:func:`~lowprec_moe.backends.cupy.gemm.ranges.mx_range_words`; tests read the flag to tell
    which staging mode the persistent form takes)."""
    if not prep["launch"].mx_ranges:
        raise ValueError(f"{prep['launch'].name} reads no range words")
    (_, a_e5m2), (_, b_e5m2) = prep["modes"]
    return mx_range_words(prep["desc"], a_scale, b_scale, prep["mn"][0], prep["mn"][1],
                          bool(a_e5m2), bool(b_e5m2), prep["n_cols"], prep["rows_max"],
                          prep["num_experts"], grid_rows=prep.get("range_grid_rows"))


def grouped_gemm(p, kernel: str = "auto"):
    """Run a validated CuPy :class:`~lowprec_moe.gemm.GemmProblem`; return ``out``.

    ``kernel``: ``"auto"`` or a kernel config name (:func:`.select.choose_kernel`); ``"auto"``
    defers to :func:`lowprec_moe.config.gemm_options`.
    """
    import cupy as cp

    opts = config.gemm_options()
    if kernel == "auto":
        kernel = opts.kernel
    out = p.out if p.out is not None else cp.empty(p.out_shape, dtype=_out_dtype(p.out_dtype))
    arrays = _operand_arrays(p)
    if p.device_splits is not None:
        prep = _device_tables_of_call(p, _prepare_device_splits(p, arrays, kernel))
    else:
        prep = _prepare(p, arrays, kernel)
    grid = prep["grid"]
    if grid == 0 or out.size == 0:
        return out
    launch = prep["launch"]
    a_data, a_scale, a_amax, b_data, b_scale, b_amax = arrays
    dummy = _dummy()
    (am0, am1), (bm0, bm1) = prep["modes"]
    arg = dict(
        tiles=prep["tiles"], n_col_tiles=np.int32(prep["n_col_tiles"]), desc=prep["desc"],
        n_cols=np.int64(prep["n_cols"]), a_data=a_data,
        a_scale=a_scale if a_scale is not None else a_data,
        b_data=b_data, b_scale=b_scale if b_scale is not None else b_data,
        amax_a=a_amax if a_amax is not None else dummy,
        amax_b=b_amax if b_amax is not None else dummy,
        a_vec=np.int32(prep["a_vec"]), b_vec=np.int32(prep["b_vec"]),
        scale_mode=np.int32(p.scale_mode),
        bias=p.bias if p.bias is not None else dummy,
        probs=p.probs if p.probs is not None else dummy,
        has_bias=np.int32(p.bias is not None), has_probs=np.int32(p.probs is not None),
        out=out, out_type=np.int32(OUT_TYPES[p.out_dtype]), accumulate=np.int32(p.accumulate),
        zero_if_empty=np.int32(prep["zero_if_empty"]),
        mx_bf16=np.int32(opts.mxfp8_mma == "bf16"))
    if launch.simt:
        arg.update(a_kind=np.int32(am0), a_mn=np.int32(am1), b_kind=np.int32(bm0),
                   b_mn=np.int32(bm1))
        args = tuple(arg[name] for name in SIMT_PARAMS)
    else:
        arg.update(a_ch=np.int32(am0), a_e5m2=np.int32(am1), b_ch=np.int32(bm0),
                   b_e5m2=np.int32(bm1))
        args = tuple(arg[name] for name in MMA_PARAMS)
        if prep["pair_geom"] is not None:
            args += (_pair_maps(prep["pair_geom"], prep["desc"], a_data, b_data),)
        elif launch.tma:
            args += _tma_maps(launch, prep["tma_geom"], a_data, a_scale, b_data, b_scale)
        if launch.mx_ranges:  # the warp-specialised MXFP8 kernels: rows' block-code ranges
            words, out_of_window = _range_words(prep, a_scale, b_scale)
            args += (words, np.int32(prep["rows_max"]), np.int32(prep["n_cols"]),
                     out_of_window)
        if prep["grid_cap"]:  # persistent: the CTAs share the tiles
            args += (np.int32(grid),)
            grid = min(grid, prep["grid_cap"])
    fn = kernel_function(launch.module, launch.name)
    if launch.smem > 48 * 1024:
        key = (int(cp.cuda.runtime.getDevice()), launch.module, launch.name,
               kernels.source_hash())
        if key not in _smem_set:
            fn.max_dynamic_shared_size_bytes = launch.smem
            _smem_set.add(key)
    fn((grid,), (launch.threads,), args, shared_mem=launch.smem)
    return out


def kernel_info(p, kernel: str = "auto") -> dict:
    """Which kernel config (and MMA instruction) a validated CuPy problem runs on: for
    benchmarks."""
    if kernel == "auto":
        kernel = config.gemm_options().kernel
    if p.device_splits is not None:  # chosen as the launch does
        c = _device_splits_config(p, kernel)[2]
    else:
        c = choose_kernel(p, plan(p), kernel=kernel).config
    if c.simt:
        instr = "fma.rn.f32 (SIMT)"
    else:
        mma_type = "f16" if p.fmt == "nvfp4" or p.hp_dtype == "float16" else "bf16"
        # the 512-thread warp-specialised kernels issue m64n128k16 with A from registers (the
        # 384-thread NVFP4 ones m64n256k16); the swapped-operand kernels multiply 64 weight
        # rows by their token tile
        shape = (f"m64n{c.bm}k16" if c.role == "swap" else
                 "m64n128k16" if c.threads == 512 or c.bm != 128 else "m64n256k16")
        instr = (f"wgmma.{shape}.{mma_type}" if c.wgmma else f"mma.sync.m16n8k16.{mma_type}")
        if (p.fmt == "mxfp8" and c.wgmma and c.role != "swap"
                and config.gemm_options().mxfp8_mma == "auto"):
            instr = f"wgmma.{shape}.f16|bf16"  # fp16 for tiles inside the fp16 window
        if c.role == "ws":
            instr += " ws"
        if c.tma:
            instr += " tma"
        if c.persistent:
            instr += " persistent" + (" ragged" if c.ragged else "")
    return dict(module=c.module, kernel=c.name, instruction=instr, tile=(c.bm, c.bn),
                smem=c.smem)
