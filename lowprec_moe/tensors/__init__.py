"""Quantized containers: ``QuantizedTensor`` (one matrix), ``GroupedTensor`` (one matrix per
expert) and the scale swizzle of the GEMM-ready layout."""
