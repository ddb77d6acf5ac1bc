"""Train a small MoE regression with every lowprec_moe recipe on the GPU (CuPy).

Usage: ``python examples/train_moe_cupy.py [--steps 500] [--tokens 8192] [--recipes ...]``

Same experiment as ``train_moe_numpy.py`` (fixed random teacher, fixed routing, MSE loss, SGD),
larger by default; all arrays stay on the GPU. Needs CuPy and a CUDA GPU.
"""

from __future__ import annotations

import sys

from _moe_regression import main

DEFAULTS = dict(experts=8, k=512, n=256, tokens=8192, steps=500, lr=0.5, every=50)

if __name__ == "__main__":
    try:
        import cupy

        ok = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception as exc:  # no CuPy, no driver or no device
        ok, why = False, exc
    else:
        why = "no CUDA device"
    if not ok:
        sys.exit(f"train_moe_cupy.py needs CuPy and a CUDA GPU ({why}); "
                 "try examples/train_moe_numpy.py")
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    main(cupy, defaults=DEFAULTS, device=f"gpu (CuPy, {name})")
