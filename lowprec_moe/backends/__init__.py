"""Array backends: ``numpy`` (the bit-exact CPU reference and test oracle) and ``cupy`` (the
GPU launchers over ``raw_kernels/``), sharing one signature per operation."""
