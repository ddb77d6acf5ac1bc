"""CuPy launchers over ``raw_kernels/``; imported only when an input is a CuPy array."""
