"""Results are written through a temporary file and a rename: a reader never sees half a file, and a
write that fails leaves the previous file as it was and no temporary file behind."""

from __future__ import annotations

import json

import pytest

from planner.apps.common import atomic_save_figure, atomic_write_json, atomic_write_text


class _HalfFigure:
    """A figure whose save writes some bytes, then fails (a full disk, a kill mid-write)."""

    def savefig(self, path, **kw):
        with open(path, "wb") as fh:
            fh.write(b"\x89PNG half")
        raise OSError("no space left on device")


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_text_and_json_replace_the_file_whole(tmp_path):
    path = atomic_write_text(tmp_path / "sub" / "a.txt", "one")
    assert path.read_text() == "one"
    atomic_write_json(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1} and _leftovers(path.parent) == []
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_failed_text_write_keeps_the_old_file(tmp_path):
    path = atomic_write_text(tmp_path / "a.json", "old")
    with pytest.raises(TypeError):
        atomic_write_json(path, {"x": object()})  # not JSON: fails before anything is renamed
    with pytest.raises(TypeError):
        atomic_write_text(path, b"bytes")  # fails while writing the temporary file
    assert path.read_text() == "old" and _leftovers(tmp_path) == []


def test_a_figure_is_saved_whole_or_not_at_all(tmp_path):
    from validation.studies.common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = atomic_save_figure(fig, tmp_path / "f.png", dpi=50)
    plt.close(fig)
    first = path.read_bytes()
    assert first.startswith(b"\x89PNG\r\n") and _leftovers(tmp_path) == []
    with pytest.raises(OSError, match="no space"):
        atomic_save_figure(_HalfFigure(), path)
    assert path.read_bytes() == first and _leftovers(tmp_path) == []
