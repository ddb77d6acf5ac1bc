"""Expert parallelism: send each token to the experts its router chose, run the grouped layers
on them, and combine the experts' outputs back in token order.

The tokens travel either as bf16 or as the rowwise MXFP8 wire format (1 byte per element and
one E8M0 scale per 32, about half of bf16), which :func:`lowprec_moe.grouped_linear_forward` /
:func:`lowprec_moe.grouped_mlp_forward` take as they are (a wire ``GroupedTensor``): each token
is quantized once, before it is sent, so the fprop operand is never requantized.

``group=None`` is one process holding every expert: the same calls without communication, on
NumPy or CuPy. A process group over several GPUs (NCCL all-to-all) is not implemented yet and
raises ``NotImplementedError``.

Order and determinism: a token's ``k`` copies are listed expert by expert, and within an
expert in token order, then slot order; :func:`combine` adds a token's ``k`` weighted outputs
in slot order in float32, so results are bitwise reproducible.
"""

from lowprec_moe.ep.dispatch import (DispatchHandle, combine, combine_backward, dispatch,
                                     dispatch_backward)

__all__ = ["DispatchHandle", "combine", "combine_backward", "dispatch", "dispatch_backward"]
