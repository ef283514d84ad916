"""A first run in a fresh environment keeps library noise (matplotlib's font cache) off stdout and the log."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_fresh_font_cache_is_not_announced(tmp_path):
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}  # an empty cache: matplotlib rebuilds it
    run = tmp_path / "run"
    code = "import sys; from planner.apps.search import main; sys.argv[0] = 'shard-search'; main()"
    proc = subprocess.run([sys.executable, "-c", code, "experiment=dense-70b-1node", "planner=random",
                           "planner.budget=16", f"hydra.run.dir={run}"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "search_curve.png").is_file()  # the figure was drawn, so matplotlib ran
    logs = "".join(p.read_text() for p in run.glob("*.log"))
    for text in (proc.stdout, proc.stderr, logs):
        assert "fontManager" not in text and "font cache" not in text
