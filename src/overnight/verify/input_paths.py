"""Input paths as steps record them, and where a recorded one is read now.

A file or directory a step reads (``ctx.read_input``, ``ctx.track_input``, ``ctx.track_listing``,
``@task.step(inputs=[...])``) or a task declares (``Task(inputs=[...])``) is recorded **relative to
the project root** when it lies inside it (``data/input.txt``, POSIX separators) and absolute
otherwise. The project root is the one the task's code location is recorded against
(:func:`overnight.runtime.task_code.project_root`: the folder holding ``overnight.toml``, else the
current directory). A recorded relative path is read under the project root of the process
checking it now, so a project copied or moved elsewhere checks its own inputs; an absolute one is
read where it says.

Records written before this (absolute paths inside the project) are read compatibly: an absolute
path inside a *recorded* project root -- the task spec's ``project`` (where the task last ran),
else one inferred from the paths themselves (:func:`infer_root`) -- is read at the same place under
the current root. Stored data never makes overnight read outside the project a path did not name
itself: a relative path with a ``..`` component, or an absolute one, is never joined to the root
(:data:`REFUSED` stands for its digest), and a mapped path always lands inside the current root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

REFUSED = "refused: not inside the project"
"""The digest a recorded relative path gets when it would leave the project (a ``..`` component, a
drive or NUL): never read, so it always differs from what was recorded (drift, not a read)."""

MAX_INFER_KEYS = 64
"""At most this many absolute recorded paths are looked at to infer an old record's project root
(each costs a few ``stat`` calls); the first ones found agree in practice."""


def _under(path: str, folder: str) -> str | None:
    """``path`` relative to ``folder`` (POSIX separators; ``"."`` for the folder itself) when it lies
    inside it, compared as absolute normalized text (no file system access), else None."""
    try:
        if os.path.commonpath([path, folder]) != folder:
            return None
    except ValueError:  # one relative, or on different drives
        return None
    rel = os.path.relpath(path, folder)
    return rel.replace(os.sep, "/") if os.sep != "/" else rel


def safe_relative(key: str) -> str | None:
    """A recorded relative path as a path to join to the project root, or None when it could leave
    it: absolute, with a drive, a NUL, or a ``..`` component (never recorded by overnight)."""
    if not key or "\0" in key or os.path.isabs(key) or os.path.splitdrive(key)[0] or key.startswith(("/", "\\")):
        return None
    parts = key.replace("\\", "/").split("/")
    if any(p == ".." for p in parts):
        return None
    return os.path.normpath(key)


@dataclass(frozen=True)
class ProjectPaths:
    """The project root input paths are recorded against and resolved under.

    Attributes:
        root: the current project root (absolute, resolved).
        recorded: project roots absolute recorded paths may lie in (the spec's ``project`` and an
            inferred one, :func:`infer_root`), each read under ``root`` instead.
        moved_from: the project root the task's spec records when it differs from ``root`` (the
            project was moved or copied), else None; for the ``project moved`` line.
    """

    root: str
    recorded: tuple[str, ...] = ()
    moved_from: str | None = None

    @classmethod
    def here(cls) -> "ProjectPaths":
        """The current project's (``overnight.toml``'s folder, else the current directory)."""
        from overnight.config import find_file

        found = find_file()
        return cls(os.path.realpath(found.parent if found is not None else os.getcwd()))

    def key(self, path: str | os.PathLike[str]) -> str:
        """How a path a step reads is recorded: relative to :attr:`root` when it lies inside it
        (the path as given, then with its folder's symlinks resolved), else absolute."""
        p = os.path.abspath(path)
        rel = _under(p, self.root)
        if rel is None:
            real = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
            rel = _under(real, self.root)
        return p if rel is None else rel

    def canonical(self, key: str) -> str:
        """A recorded key as it would be recorded now: an absolute path inside :attr:`root` or a
        recorded root becomes relative; a relative or outside one is returned as it is."""
        if not os.path.isabs(key):
            return key
        for folder in (self.root, *self.recorded):
            rel = _under(os.path.normpath(key), folder)
            if rel is not None:
                return rel
        return key

    def resolve(self, key: str) -> str | None:
        """The path to read now for a recorded key, or None for a relative one that would leave the
        project (:func:`safe_relative`)."""
        if os.path.isabs(key):
            canon = self.canonical(key)
            return key if canon == key else os.path.join(self.root, os.path.normpath(canon))
        rel = safe_relative(key)
        return None if rel is None else os.path.join(self.root, rel)

    def moved_line(self) -> str | None:
        """``project moved: recorded at OLD, now NEW`` when :attr:`moved_from`, else None."""
        if self.moved_from is None:
            return None
        return f"project moved: recorded at {printable(self.moved_from)}, now {printable(self.root)}"


def printable(text: str) -> str:
    """Stored text as a line shows it: control characters escaped, at most 1,000 characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= 1000 else out[:999] + "…"


def infer_root(keys: Iterable[str], root: str, marker: str | None) -> str | None:
    """The project root that absolute recorded paths were made in, for a record that does not say
    (a task created before its spec recorded ``project``), or None.

    For each absolute path ``A/REL`` outside ``root`` (at most :data:`MAX_INFER_KEYS`), the
    shallowest folder ``A`` such that ``root/REL`` exists now and ``A`` is the old place of this
    project: it no longer exists (the project was moved), or it holds ``marker`` too (the task's
    code file, relative to the project: a copy). ``A`` is never ``/``, ``root``, a folder holding
    ``root`` or one inside it. The folder most paths agree on wins (the shallowest on a tie).
    Only ``stat`` calls; nothing is read.
    """
    votes: dict[str, int] = {}
    seen = 0
    for key in keys:
        if not isinstance(key, str) or not os.path.isabs(key) or "\0" in key:
            continue
        path = os.path.normpath(key)
        if _under(path, root) is not None:
            continue
        seen += 1
        if seen > MAX_INFER_KEYS:
            break
        parts = path.split(os.sep)
        for i in range(2, len(parts)):  # shallowest first: /x, /x/y, ... (never "/" itself)
            folder = os.sep.join(parts[:i]) or os.sep
            if _under(root, folder) is not None or _under(folder, root) is not None:
                continue
            rel = os.sep.join(parts[i:])
            if not os.path.lexists(os.path.join(root, rel)):
                continue
            if os.path.exists(folder) and not (marker and os.path.exists(os.path.join(folder, marker))):
                continue
            votes[folder] = votes.get(folder, 0) + 1
            break
    if not votes:
        return None
    return min(votes, key=lambda f: (-votes[f], len(f), f))


__all__ = ["MAX_INFER_KEYS", "REFUSED", "ProjectPaths", "infer_root", "printable", "safe_relative"]
