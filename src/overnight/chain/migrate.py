"""Format migrations: a record or state written by an earlier overnight is upgraded on load.

Each entry maps a format version ``N`` to a function that turns a format-``N`` tree into a new
format-``N+1`` tree (without mutating its input); :func:`upgrade` applies them in order up to
:data:`~overnight.chain.records.FORMAT_VERSION`. Migrations run on the *parsed, verified* tree
(the digest and signature cover the bytes as written, in their own format) and never write back:
stored records are immutable. A version above the current one is refused, never guessed at.

Format 1 is the first format, so both tables are empty; every future format change adds an entry
here, a test that loads a stored record of the old format, and a line in ``docs/FORMAT.md``.
"""

from __future__ import annotations

from typing import Any, Callable

from overnight.errors import FormatTooNew, SchemaError
from overnight.chain.records import FORMAT_VERSION

Migration = Callable[[dict[str, Any]], dict[str, Any]]

RECORD_MIGRATIONS: dict[int, Migration] = {}
"""Checkpoint record migrations, ``N -> N+1``."""

STATE_MIGRATIONS: dict[int, Migration] = {}
"""State document migrations, ``N -> N+1``."""


def upgrade(tree: Any, what: str, migrations: dict[int, Migration], **ids: Any) -> dict[str, Any]:
    """Return ``tree`` upgraded to :data:`FORMAT_VERSION`.

    Raises:
        SchemaError: no integer ``format`` member, or a version below 1 / with no migration path.
        FormatTooNew: written by a newer overnight.
    """
    fmt = tree.get("format") if isinstance(tree, dict) else None
    if type(fmt) is not int:
        raise SchemaError(f"{what} has no valid 'format' field", **ids)
    if fmt > FORMAT_VERSION:
        raise FormatTooNew(
            f"{what} was written by a newer overnight (format {fmt}); this one reads up to format {FORMAT_VERSION}",
            hint="upgrade overnight to resume this task",
            **ids,
        )
    while fmt < FORMAT_VERSION:
        step = migrations.get(fmt)
        if step is None:
            raise SchemaError(f"{what} has format {fmt}, which this overnight cannot read", **ids)
        tree = step(tree)
        fmt = tree["format"]
    return tree
