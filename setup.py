"""Package list for setuptools (everything else is in pyproject.toml).

The CUDA sources live in ``raw_kernels/`` at the top of the repository and ship inside the
wheel as the package ``lowprec_moe.raw_kernels`` (mapped in pyproject.toml). pyproject.toml
cannot combine automatic package discovery with that extra mapped package, hence this file.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["lowprec_moe", "lowprec_moe.*"]) + ["lowprec_moe.raw_kernels"],
)
