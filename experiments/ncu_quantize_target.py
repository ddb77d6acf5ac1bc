"""One call of each quantize path (target for ``ncu``; see the former benchmarks/RESULTS.md, in git history)."""
import cupy as cp
import ml_dtypes

import lowprec_moe as lpm

x = cp.random.default_rng(0).standard_normal((16384, 7168), dtype=cp.float32).astype(
    ml_dtypes.bfloat16)
lpm.quantize(x, "nvfp4", columnwise=True)
q = lpm.quantize(x, "mxfp8", columnwise=True)
w = lpm.GroupedTensor.from_mxfp8_rowwise(q.rowwise_data, q.rowwise_scale, [2048] * 8)
w.with_columnwise()
cp.cuda.Device().synchronize()
