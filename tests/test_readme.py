"""The README's Python examples run as written (CPU backend)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python examples"
    exec(compile("\n".join(blocks), str(README), "exec"), {})


def test_readme_has_two_setup_commands():
    text = README.read_text()
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```\n(.*?)\n```", setup, re.S)
    assert commands == ['pip install -e . && lowprec-moe demo',
                        'pip install -e ".[test]" && python -m pytest -q']
