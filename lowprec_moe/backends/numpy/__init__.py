"""The NumPy backend: bit-exact reference of every kernel, the CPU path and the test oracle."""
