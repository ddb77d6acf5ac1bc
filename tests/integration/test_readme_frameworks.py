"""The README's "Use from PyTorch" and "Use from JAX" examples run as written (CPU)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _section_code(title: str) -> str:
    text = README.read_text()
    assert f"\n## {title}\n" in text, f"README has no '## {title}' section"
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```py\n(.*?)```", section, re.S)
    assert blocks, f"'## {title}' has no py example"
    return "\n".join(blocks)


def test_use_from_pytorch_runs():
    pytest.importorskip("torch")
    exec(compile(_section_code("Use from PyTorch"), str(README), "exec"), {})


def test_use_from_jax_runs():
    pytest.importorskip("jax")
    exec(compile(_section_code("Use from JAX"), str(README), "exec"), {})
