"""Where a stored task's code is looked up (``overnight.runtime.task_code``), without executing it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from overnight.runtime.task_code import check_location


def test_a_task_in_a_nested_namespace_package_is_located_without_importing_it(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``nspkg.inner.mod:task`` with no ``__init__.py`` at either level: importlib recomputes a
    nested namespace package's path from its parent in ``sys.modules``, which a look-up that
    imports nothing does not have (it raised a bare KeyError in `overnight resume` and the worker)."""
    (tmp_path / "nspkg" / "inner").mkdir(parents=True)
    (tmp_path / "nspkg" / "inner" / "mod.py").write_text("raise SystemExit('imported!')\n")
    (tmp_path / "overnight.toml").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_location("nspkg.inner.mod:task", task_id="t", root=tmp_path)  # inside the project: accepted
    assert "nspkg" not in sys.modules and "nspkg.inner.mod" not in sys.modules
