"""``python -m lowprec_moe.backends.cupy.gemm DIR``: write the generated grouped-GEMM modules to
``DIR/<module>.cu`` (for an offline nvcc check)."""

import sys

from lowprec_moe.backends.cupy.gemm.compile import write_sources

if len(sys.argv) != 2:
    sys.exit("usage: python -m lowprec_moe.backends.cupy.gemm DIR")
for path in write_sources(sys.argv[1]):
    print(path)
