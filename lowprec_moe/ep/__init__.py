"""Expert parallelism: send each token to the experts its router chose, run the grouped layers
on them, and combine the experts' outputs back in token order.

The tokens travel either as bf16 or as the rowwise MXFP8 wire format (1 byte per element and
one E8M0 scale per 32, about half of bf16), which :func:`lowprec_moe.grouped_linear_forward` /
:func:`lowprec_moe.grouped_mlp_forward` take as they are (a wire ``GroupedTensor``): each token
is quantized once, before it is sent, so the fprop operand is never requantized.

``group=None`` is one process holding every expert: the same calls without communication, on
NumPy or CuPy. Across GPUs, :func:`init_process_group` joins an NCCL group (one process per GPU,
started by ``python -m lowprec_moe.ep.launch --nproc N script.py``) and each rank holds
``E / N`` consecutive experts; the exchanges are all-to-all-v's of NCCL send / recv pairs
(through CuPy). :class:`ThreadGroup` / :func:`run_threads` run the same multi-rank algorithm in
threads of one process, on NumPy arrays too.

Order and determinism: a rank's experts receive their rows sorted by expert, then source rank,
then token, then slot -- the order one process gives the concatenation of all ranks' tokens --
and :func:`combine` adds a token's ``k`` weighted outputs on the token's rank in slot order in
float32. Results are bitwise reproducible and, on the MXFP8 and bf16 recipes, bitwise equal to
one process running the whole model.

Host synchronisation: one per :func:`dispatch`, where the received per-expert counts are read to
size the receive buffers; combine and the backward functions reuse those counts.
"""

from lowprec_moe.ep.dispatch import (DispatchHandle, Route, combine, combine_backward, dispatch,
                                     dispatch_backward)
from lowprec_moe.ep.group import Group, ThreadGroup, run_threads
from lowprec_moe.ep.layer import MoEContext, MoEGrads, moe_backward, moe_forward
from lowprec_moe.ep.nccl import ProcessGroup, init_process_group, read_environment

__all__ = ["DispatchHandle", "Group", "MoEContext", "MoEGrads", "ProcessGroup", "Route",
           "ThreadGroup", "combine", "combine_backward", "dispatch", "dispatch_backward",
           "init_process_group", "moe_backward", "moe_forward", "read_environment",
           "run_threads"]
