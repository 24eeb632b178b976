"""Plumbing and error surface: ``overnight cat-object`` and ``show --json --raw`` walk a task by
hand (docs/FORMAT.md, "Verifying a task by hand"); the library raises only typed errors, each
listed in ``errors.py``'s docstring with the exit code the CLI gives it."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

from test_cli import ROOT, cli

from overnight.chain.records import FORMAT_VERSION


def test_cat_object_and_show_raw_walk_a_task_by_hand(tmp_path):
    """FORMAT.md's "Verifying a task by hand": from the ref to a done page with the plumbing, each
    object's bytes hashing to its digest; damage is exit 3, an absent object exit 2."""
    import hashlib

    cli("demo", "--max-steps", "3", cwd=tmp_path, check=75)
    show = json.loads(cli("show", "api-report-email", "--json", "--raw", cwd=tmp_path).stdout)
    head = show["branches"]["main"]
    entry = next(c for c in show["chain"] if c["checkpoint_id"] == head)
    body = subprocess.run([sys.executable, "-m", "overnight", "cat-object", head], cwd=tmp_path,
                          capture_output=True, timeout=120).stdout
    assert "sha256:" + hashlib.sha256(body).hexdigest() == head
    assert json.loads(body) == entry["record"]  # the record as stored
    state_digest = entry["record"]["state"]["digest"]
    state = subprocess.run([sys.executable, "-m", "overnight", "cat-object", state_digest], cwd=tmp_path,
                           capture_output=True, timeout=120).stdout
    assert "sha256:" + hashlib.sha256(state).hexdigest() == state_digest
    assert json.loads(state) == show["state"] and show["state"]["format"] == FORMAT_VERSION
    page = show["state"]["done"]["pages"][-1]["digest"]
    done = json.loads(cli("cat-object", page[7:], cwd=tmp_path).stdout)  # the hex digits alone do too
    assert [d["name"] for d in done][-1] == show["chain"][-1]["step"]
    plain = json.loads(cli("show", "api-report-email", "--json", cwd=tmp_path).stdout)
    assert plain["chain"][0]["record"] is None and plain["state"] is None
    assert "--raw needs --json" in cli("show", "api-report-email", "--raw", cwd=tmp_path, check=2).stderr

    absent = cli("cat-object", "sha256:" + "0" * 64, cwd=tmp_path, check=2).stderr
    assert "no object or checkpoint" in absent
    assert "is not a digest" in cli("cat-object", "nope", cwd=tmp_path, check=2).stderr
    db = tmp_path / ".overnight" / "overnight.db"
    with sqlite3.connect(db) as conn:  # damage the state blob: same length, other bytes
        data, codec = conn.execute("SELECT data, codec FROM objects WHERE digest = ?", (state_digest,)).fetchone()
        bad = bytes([data[0] ^ 0xFF]) + data[1:] if codec == "none" else data[:-4] + b"\0\0\0\0"
        conn.execute("UPDATE objects SET data = ? WHERE digest = ?", (bad, state_digest))
    damaged = cli("cat-object", state_digest, cwd=tmp_path, check=3).stderr
    assert state_digest[7:19] in damaged or state_digest in damaged


def test_errors_docstring_lists_every_class_with_its_exit_code():
    import inspect

    from overnight import errors
    from overnight.cli.common import exit_code as _exit_code

    doc = errors.__doc__
    classes = {n for n, c in vars(errors).items() if inspect.isclass(c) and c.__module__ == errors.__name__}
    listed: dict[str, int] = {}
    for bullet in re.findall(r"^\* .*?(?=^\* |^\S|\Z)", doc, re.M | re.S):
        code = int(re.search(r"exit (\d+)", bullet).group(1))
        for name, own in re.findall(r":class:`(\w+)`(?: \(exit (\d+))?", bullet):
            listed.setdefault(name, int(own) if own else code)
    assert classes - {"OvernightError"} <= set(listed), f"not in errors.py's docstring: {classes - set(listed)}"
    for name, code in listed.items():
        cls = getattr(errors, name)
        if issubclass(cls, errors.OvernightError):
            got = _exit_code(cls.__new__(cls))  # the code depends on the class alone
            assert got == code, f"{name}: the CLI exits {got}, the docstring says {code}"
    assert listed["StoreFull"] == 6


def test_the_library_raises_only_typed_errors():
    """No raw ValueError/RuntimeError/TypeError/OSError/KeyError raise in ``src/overnight``: every
    error a caller can meet is one of ``overnight.errors`` (which keep those as bases where
    callers expect them: ``ConfigError`` is a ``ValueError``, ``EncodeError`` a ``TypeError``)."""
    import ast

    raw = []
    for path in sorted((ROOT / "src" / "overnight").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in ("ValueError", "RuntimeError", "TypeError", "OSError",
                                                            "KeyError", "Exception", "LookupError"):
                    raw.append(f"{path.relative_to(ROOT)}:{node.lineno}: raise {exc.id}")
    assert not raw, "\n".join(raw)
