"""The README's Python example runs as written: its first ```python block, in a fresh interpreter of this
repository's Python, from an empty directory (so it reads nothing from the working tree by accident)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_python_block(text: str) -> str:
    """The body of the first ```python fenced block of a markdown text."""
    match = re.search(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_first_python_block_is_found():
    text = "intro\n```bash\nmake run\n```\n```python\nprint(1)\n```\n```python\nprint(2)\n```\n"
    assert first_python_block(text) == "print(1)\n"


def test_readme_python_example_runs_as_written(tmp_path: Path):
    code = first_python_block((ROOT / "README.md").read_text())
    assert "from planner import api" in code  # the example of planner/api.py's docstring, not another one
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == code.count("print("), proc.stdout  # every print ran
    assert sorted(p.name for p in tmp_path.iterdir()) == [script.name]  # it wrote nothing beside itself


def test_readme_example_is_the_api_docstrings():
    """The README shows the example ``planner/api.py`` documents, line for line."""
    doc = ast.get_docstring(ast.parse((ROOT / "planner" / "api.py").read_text())) or ""
    code = first_python_block((ROOT / "README.md").read_text())
    doc_lines = [line.strip() for line in doc.splitlines() if line.strip()]
    for line in filter(None, (line.strip() for line in code.splitlines())):
        assert line in doc_lines, f"not in planner/api.py's docstring example: {line}"
