"""Train a tiny MoE regression with every lowprec_moe recipe on the CPU (NumPy reference).

Usage: ``python examples/train_moe_numpy.py [--steps 300] [--recipes bf16,nvfp4]``

A student GroupedLinear learns a fixed random teacher (fixed routing, MSE loss, SGD); the loss
curve of each recipe is printed next to the bf16 baseline. Takes well under a minute.
"""

from __future__ import annotations

import numpy as np

from _moe_regression import main

DEFAULTS = dict(experts=4, k=64, n=32, tokens=256, steps=300, lr=0.5, every=25)

if __name__ == "__main__":
    main(np, defaults=DEFAULTS, device="cpu (NumPy)")
