"""docs/FORMAT.md is the code: its record tables name exactly the members of the pydantic models
in ``overnight/chain/records.py``, with the same optional ones, so the spec cannot drift apart
from what is written and read."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from overnight.chain import records

FORMAT_MD = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"

TABLES = {
    # heading (start of the line, without the #s) -> the model its first table specifies
    "Checkpoint record (format": records.CheckpointRecord,
    "State document (format": records.StateDoc,
    "Todo entry": records.TodoEntry,
    "Done entry": records.DoneEntry,
    "Artifact reference": records.ArtifactRef,
    "World fingerprint (format": records.WorldDoc,
}


def tables(text: str) -> dict[str, list[list[str]]]:
    """Heading -> rows (cells) of the first markdown table under it."""
    out: dict[str, list[list[str]]] = {}
    heading, rows, in_table = None, [], False
    for line in text.splitlines():
        if line.startswith("#"):
            heading, rows, in_table = line.lstrip("#").strip(), [], False
            continue
        if heading is None or heading in out:
            continue
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif in_table:
            out[heading] = rows[1:]  # the header row is not a member
    return out


def members(cell: str) -> list[str]:
    """Member names in a table's first column: each backticked word (`a`, `b`)."""
    return re.findall(r"`([a-z_]+)`", cell)


def top_level_keys(cell: str) -> set[str] | None:
    """The quoted names at the first nesting level of the first ``{...}`` in a cell, or None."""
    start = cell.find("{")
    if start < 0:
        return None
    keys, depth, i = set(), 0, start
    while i < len(cell):
        ch = cell[i]
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                break
        elif ch == '"' and depth == 1:
            end = cell.index('"', i + 1)
            keys.add(cell[i + 1:end])
            i = end
        i += 1
    return keys


def submodel(annotation) -> type[BaseModel] | None:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def spec(path: Path = FORMAT_MD) -> dict[str, tuple[type[BaseModel], list[list[str]]]]:
    found = tables(path.read_text(encoding="utf-8"))
    out = {}
    for prefix, model in TABLES.items():
        heading = next((h for h in found if h.startswith(prefix)), None)
        assert heading is not None, f"FORMAT.md has no table under a heading starting {prefix!r}"
        out[prefix] = (model, found[heading])
    return out


@pytest.mark.parametrize("prefix", list(TABLES))
def test_format_md_tables_name_exactly_the_model_fields(prefix):
    check_table(prefix, FORMAT_MD)


def check_table(prefix: str, path: Path) -> None:
    """Raise AssertionError where the table under ``prefix`` and its model disagree."""
    model, rows = spec(path)[prefix]
    documented: dict[str, list[str]] = {}
    for row in rows:
        for name in members(row[0]):
            documented[name] = row
    assert set(documented) == set(model.model_fields), (
        f"FORMAT.md '{prefix}' documents {sorted(documented)}, {model.__name__} has {sorted(model.model_fields)}")
    for name, field in model.model_fields.items():
        row = documented[name]
        optional_in_doc = "optional" in " ".join(row[1:]).lower()
        assert optional_in_doc == (not field.is_required()), (
            f"{model.__name__}.{name}: required={field.is_required()} but FORMAT.md says "
            f"{'optional' if optional_in_doc else 'required'}")
        sub = submodel(field.annotation)
        keys = top_level_keys(row[1]) if len(row) > 2 else None
        if sub is not None and keys is not None and sub is not records.Pages:
            assert keys == set(sub.model_fields), (
                f"{model.__name__}.{name}: FORMAT.md lists {sorted(keys)}, {sub.__name__} has {sorted(sub.model_fields)}")
        if sub is records.Pages and keys is not None:
            assert keys == set(records.Pages.model_fields)


@pytest.mark.parametrize("prefix, old, new, says", [
    ("Done entry", "| `replayed_tokens` | int |", "| `replayed` | int |", "replayed"),  # a renamed member
    ("State document (format", '`{"summary", "compactions", "messages", "tokens"}`', '`{"summary", "compactions"}`',
     "context"),  # a nested member missing (format 1 as first written)
    ("World fingerprint (format", "| `model` | optional (absent in format 1):", "| `model` |", "required"),
])
def test_the_check_fails_when_spec_and_model_disagree(tmp_path, prefix, old, new, says):
    text = FORMAT_MD.read_text(encoding="utf-8")
    assert old in text
    doc = tmp_path / "FORMAT.md"
    doc.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(AssertionError, match=says):
        check_table(prefix, doc)


def test_format_version_is_the_documented_one():
    text = FORMAT_MD.read_text(encoding="utf-8")
    assert f"**record format {records.FORMAT_VERSION}**" in text
    assert f"## Checkpoint record (format {records.FORMAT_VERSION})" in text
    assert f"## State document (format {records.FORMAT_VERSION})" in text
    assert f"- **Record format {records.FORMAT_VERSION}**" in text  # a change-log entry

