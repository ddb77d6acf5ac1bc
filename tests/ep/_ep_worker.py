"""One rank of the multi-GPU expert-parallel checks; run by test_ep_multi_gpu.py as

    python -m lowprec_moe.ep.launch --nproc N tests/ep/_ep_worker.py [--cases ...] [--wires ...]

Each rank joins the NCCL group, checks the two collectives on known data, then for every case
and wire runs the whole model on its own GPU in one process (the reference) and its share of
the model over NCCL twice, and compares the bytes of its output and gradients with its share of
the reference (and the two runs with each other). One line per check; exit status 1 when
anything differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import lowprec_moe  # noqa: F401
except ImportError:  # a checkout that is not installed
    sys.path.insert(0, str(HERE.parents[1]))

import cupy as cp  # noqa: E402

import _ep_cases as C  # noqa: E402
from lowprec_moe import ep  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(C.CASES))
    ap.add_argument("--wires", default=",".join(C.WIRES))
    args = ap.parse_args()
    failures = []
    with ep.init_process_group(timeout=180) as group:
        r = group.rank
        bad = C.collective_mismatches(group, cp)
        print(f"rank {r} collectives: {'ok' if not bad else 'MISMATCH'}", flush=True)
        failures += bad
        for case in args.cases.split(","):
            p = C.problem(group.size, case)
            for wires in args.wires.split(","):
                ref = C.reference(cp, p, wires)
                first = C.run_rank(group, cp, p, wires)
                second = C.run_rank(group, cp, p, wires)
                bad = (C.mismatches(r, group.size, first, ref, p)
                       + [f"second run: {m}" for m in C.mismatches(r, group.size, second, ref,
                                                                    p)])
                print(f"rank {r} {case} {wires}: {'ok' if not bad else 'MISMATCH'}", flush=True)
                for m in bad:
                    print("  " + m, flush=True)
                failures += bad
        group.barrier()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
