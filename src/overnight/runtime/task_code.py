"""Loading task code: the one place overnight imports a module or a file.

Code comes from the project, never from the store. A location the user names (``overnight run
FILE.py``, ``--file``, ``overnight.run("FILE.py")``) is loaded as given. A location read from
stored data -- the entry recorded when the task was created, which ``resume`` and ``status
--drift`` need -- is imported only if it resolves inside the **project root** (the folder holding
``overnight.toml``, else the current directory) or inside overnight's own package (the demo);
anything else raises :class:`~overnight.errors.CodeLocationRefused` naming it and saying how to pass
``--file``. A module name is resolved to its file *without* importing anything (not even its
parent packages) before that check. The stored location is also checked against the one in the
verified head's spec (covered by the checkpoint digest, and by the signature with a signing key):
the store's task row alone is never trusted (:class:`~overnight.errors.EntryMismatch`).

Locations are recorded relative to the project root when they lie inside it (``tasks/notes.py:task``),
so a project moved or cloned elsewhere resumes unchanged; one outside is recorded absolute (and
then needs ``--file`` to resume).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from overnight.codec.canonical import from_tree
from overnight.codec.registry import file_module_name
from overnight.config import find_file
from overnight.errors import CodeLocationRefused, ConfigError, EntryMismatch, OvernightError
from overnight.runtime.task import Task


def project_root() -> Path:
    """The folder holding ``overnight.toml`` (``$OVERNIGHT_CONFIG``, or the first one in the
    current directory or a parent), else the current directory; resolved."""
    found = find_file()
    return (found.parent if found is not None else Path.cwd()).resolve()


def _split(entry: str) -> tuple[str, str]:
    target, attr = entry, ""
    head, sep, tail = entry.rpartition(":")
    if sep and head and tail.isidentifier():
        target, attr = head, tail
    return target, attr


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def entry_path(entry: str | None, root: Path | None = None) -> Path | None:
    """The absolute file of a ``FILE.py[:NAME]`` entry (a relative one is under the project
    root), or None for a module entry or no entry."""
    if not entry:
        return None
    target, _ = _split(entry)
    if not _is_path(target):
        return None
    path = Path(target).expanduser()
    return (path if path.is_absolute() else (root or project_root()) / path).resolve()


def recorded_entry(entry: str, root: Path | None = None) -> str:
    """``entry`` as the store records it: a file inside the project root relative to it (POSIX
    separators), anything else unchanged."""
    path = entry_path(entry, root)
    if path is None:
        return entry
    _, attr = _split(entry)
    base = root or project_root()
    try:
        rel = path.relative_to(base).as_posix()
    except ValueError:
        rel = str(path)
    return f"{rel}:{attr}" if attr else rel


def same_location(a: str | None, b: str | None) -> bool:
    """Do two entries name the same code (a relative and an absolute path to one file agree)?"""
    if a == b:
        return True
    if not a or not b or _split(a)[1] != _split(b)[1]:
        return False
    pa, pb = entry_path(a), entry_path(b)
    return pa is not None and pa == pb


def _module_origin(name: str) -> Path | None:
    """The file a module name would import, found without executing any code (parent packages
    are located on the path, not imported). None when it cannot be found."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    if parts[0] in sys.modules:
        spec = getattr(sys.modules[parts[0]], "__spec__", None)
    else:
        spec = importlib.machinery.PathFinder.find_spec(parts[0], sys.path)
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        locations = list(spec.submodule_search_locations)
        name = ".".join(parts[: i + 1])
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, locations)
        except KeyError:  # a namespace package in a namespace package: importlib reads its parent's path
            # from sys.modules, which has no parent here; its portions are its folders on the parent's path
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [os.path.join(d, parts[i]) for d in locations
                                               if os.path.isdir(os.path.join(d, parts[i]))]
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    return Path(spec.origin).resolve()


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def check_location(entry: str, *, task_id: str | None = None, root: Path | None = None) -> None:
    """Refuse a code location read from stored data unless it lies inside the project root --
    not in a virtual environment or installed-packages folder under it (:func:`_installed_under`:
    a ``.venv`` in the project holds every installed package, whose modules a store could name) --
    or is overnight's demo (``overnight demo``'s task; no other module of the package).

    Raises:
        CodeLocationRefused: naming the location, where it resolved, and how to pass ``--file``.
    """
    base = root or project_root()
    target, _ = _split(entry)
    where = entry_path(entry, base) if _is_path(target) else _module_origin(target)
    # of overnight's own package only the demo defines a task: no other module of it is imported
    # (nor any of its functions called) because a store names it
    demo = Path(__file__).resolve().parent.parent / "demo"
    if where is not None and _inside(where, demo):
        return
    installed = _installed_under(where, base) if where is not None and _inside(where, base) else None
    if where is not None and _inside(where, base) and installed is None:
        return
    if installed is not None:  # a virtualenv in the project holds every installed package: none is the project's
        raise CodeLocationRefused(
            f"task {task_id!r}: the store says its code is {entry} (resolves to {where}), inside {installed}: "
            "installed packages, not the project's own code; overnight imports code only from the project or from "
            "what you name", task_id=task_id, location=entry,
            hint=f"name the code you trust: overnight resume {task_id} --file FILE.py[:NAME] "
            "(also for `status --drift`)")
    resolved = f" (resolves to {where})" if where is not None else " (not found without importing it)"
    raise CodeLocationRefused(
        f"task {task_id!r}: the store says its code is {entry}{resolved}, outside the project {base}; overnight "
        "imports code only from the project (the folder holding overnight.toml, else the current directory) or "
        "from what you name", task_id=task_id, location=entry,
        hint=f"run from the project folder, or name the code you trust: overnight resume {task_id} --file "
        "FILE.py[:NAME] (also for `status --drift`)")


def _installed_under(where: Path, base: Path) -> Path | None:
    """The folder of installed packages under ``base`` that holds ``where`` -- a virtual
    environment (``pyvenv.cfg``), a conda environment (``conda-meta``) or a ``site-packages`` /
    ``dist-packages`` folder -- or None. The project's own folders are looked at, not ``base``."""
    for parent in where.parents:
        if parent == base or not _inside(parent, base):
            return None
        if parent.name in ("site-packages", "dist-packages") or (parent / "pyvenv.cfg").is_file() \
                or (parent / "conda-meta").is_dir():
            return parent
    return None


def _load_module(path: Path) -> Any:
    # classes in the file are stored as "<module>:<Qualname>", so the name must be the same on
    # every run: the file's stem, unless that would shadow an imported module
    for loaded in (sys.modules.get(path.stem), sys.modules.get(f"overnight_task_{path.stem}")):
        if loaded is not None and getattr(loaded, "__file__", None) == str(path):
            return loaded  # loaded before in this process (a worker's session runs tasks in turn)
    name = file_module_name(str(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load task file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except (KeyboardInterrupt, SystemExit):
        sys.modules.pop(name, None)
        raise
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, OvernightError):
            raise
        where = ""
        if isinstance(exc, SyntaxError):
            where = f" (line {exc.lineno}: {exc.text.strip() if exc.text else ''})"
        else:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
            if frames:
                where = f" (line {frames[-1].lineno}: {frames[-1].line})"
        raise ConfigError(f"cannot load task file {path}: {type(exc).__name__}: {exc}{where}",
                          hint="fix the file; `python FILE.py` shows the full traceback") from exc
    return module


def load_task(entry: str, *, task_id: str | None = None, stored: bool = False) -> Task:
    """Load a task definition the *user named*: ``FILE.py[:NAME]`` (a relative path is relative to
    the current directory) or ``package.module[:NAME]``. For a location read from a store use
    :func:`load_stored_task`.

    ``NAME`` may be a :class:`~overnight.Task` or a factory ``f(task_id=...) -> Task``. Without
    ``NAME`` the module must define exactly one ``Task``. The task's ``entry`` is set to where it
    was found, relative to the project root when inside it (:func:`recorded_entry`).
    ``stored``: the location came from stored data (a task row, a queue row): a callable is then
    called only if it takes a ``task_id`` argument, as a factory does -- a store cannot make
    overnight call any other function it names.

    Raises:
        ConfigError: file or module missing, or no (or more than one) task in it.
    """
    target, attr = _split(entry)
    if _is_path(target):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"task file {target} does not exist", task_id=task_id, hint=(
                f"a stored task's code is looked up from the current directory ({Path.cwd()}): `cd` to the project "
                f"directory the task was created in and run it there; if its code moved within the project, name "
                f"the file: `overnight resume {task_id or 'TASK_ID'} --file PATH`"
                if stored else "a relative path is relative to the current directory"))
        module = _load_module(path)
        origin = str(path)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"cannot import task module {target!r}: {exc}", task_id=task_id) from exc
        origin = target
    tasks = {k: v for k, v in vars(module).items() if isinstance(v, Task)}
    if attr:
        by_id = [k for k, v in tasks.items() if v.id == attr]
        if not hasattr(module, attr) and len(by_id) == 1:
            attr = by_id[0]  # FILE.py:TASK_ID works too
        if not hasattr(module, attr):
            raise ConfigError(f"{origin} has no task named {attr!r} (as a variable or a task id)", task_id=task_id,
                              hint="tasks there: " + (", ".join(f"{k} (id {v.id})" for k, v in tasks.items()) or "none"))
        obj = getattr(module, attr)
    else:
        if not tasks:
            raise ConfigError(f"{origin} defines no overnight.Task at module level", task_id=task_id,
                              hint="define task = overnight.Task(...) in the file (a factory: FILE.py:make_task)")
        if len(tasks) > 1:
            raise ConfigError(f"{origin} defines {len(tasks)} tasks ({', '.join(tasks)}); name one as FILE.py:NAME",
                              task_id=task_id)
        attr, obj = next(iter(tasks.items()))
    if not isinstance(obj, Task) and callable(obj):
        if stored and not _takes_task_id(obj):
            raise ConfigError(f"{origin}:{attr} is not an overnight.Task nor a factory f(task_id=...); a location "
                              "read from the store is not called otherwise", task_id=task_id)
        obj = obj(task_id=task_id) if task_id is not None else obj()
    if not isinstance(obj, Task):
        raise ConfigError(f"{origin}:{attr} is not an overnight.Task", task_id=task_id)
    if task_id is not None and obj.id != task_id:
        raise ConfigError(f"{origin}:{attr} defines task {obj.id!r}, not {task_id!r}", task_id=task_id)
    obj.entry = obj.entry or recorded_entry(f"{origin}:{attr}")
    return obj


def _takes_task_id(fn: Any) -> bool:
    """Whether ``fn`` accepts a ``task_id`` keyword (a task factory's signature)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "task_id" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def main_entry(task: Task) -> str | None:
    """Where a task run by ``python FILE.py`` is defined: ``FILE.py:NAME`` (as
    :func:`recorded_entry` records it) when ``__main__`` is a ``.py`` file with ``task`` at a
    module-level name, else None -- so ``overnight resume ID`` finds the code of a task started
    either way, and ``overnight run FILE.py`` sees the same task."""
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    if not isinstance(f, str) or not f.endswith(".py"):
        return None
    names = [k for k, v in vars(main).items() if v is task and not k.startswith("_")]
    if not names:
        return None
    return recorded_entry(f"{Path(f).resolve()}:{names[0]}")


def load_stored_task(task_id: str, *, recorded: str | None, verified: str | None, override: str | None = None,
                     checkpoint_id: str | None = None, spec: dict[str, Any] | None = None) -> Task | None:
    """Load the code of a stored task: ``override`` (the user's ``--file``) as given; else the
    location the store records, after checking it (None when none is recorded).

    Args:
        recorded: the store's task row entry (not covered by any digest).
        verified: the entry in the verified head's spec (None: a task created before the spec
            recorded it; the row's is then checked for location only).
        spec: the verified head's spec. A submitted task (``overnight submit``: the spec records
            ``params`` or ``definition``) loads its definition and takes ``task_id`` and those
            params, as the worker ran it.

    Raises:
        EntryMismatch: the row names another location than the verified checkpoint.
        CodeLocationRefused: the location lies outside the project (:func:`check_location`).
        ConfigError: from :func:`load_task`.
    """
    if override is not None:
        task = load_task(override, task_id=task_id)
        if isinstance(spec, dict) and "params" in spec:  # the params its checkpoints record, with the code given
            task.params = dict(from_tree(spec["params"], "task params"))
        return task
    if verified is not None and recorded is not None and not same_location(verified, recorded):
        raise EntryMismatch(
            f"task {task_id!r}: the store's task row says its code is {recorded}, but its verified checkpoints say "
            f"{verified}; not importing code from an unverified location", task_id=task_id,
            checkpoint_id=checkpoint_id, hint=f"check the store; to run the code you trust: overnight resume "
            f"{task_id} --file FILE.py[:NAME]")
    where = verified or recorded
    if not where:
        return None
    check_location(where, task_id=task_id)
    target, attr = _split(where)
    if _is_path(target):
        path = entry_path(where)
        where = f"{path}:{attr}" if attr else str(path)
    submitted = isinstance(spec, dict) and ("params" in spec or "definition" in spec)
    task = load_task(where, task_id=None if submitted else task_id, stored=True)
    if submitted:
        definition = spec.get("definition")  # type: ignore[union-attr]
        if isinstance(definition, str) and task.id != definition:
            raise ConfigError(f"{where} defines task {task.id!r}, not {definition!r} (task {task_id!r} was submitted "
                              f"from {definition!r})", task_id=task_id, checkpoint_id=checkpoint_id)
        params = from_tree(spec.get("params", {}), "task params")  # type: ignore[union-attr]
        task = task.submitted_as(task_id, params)
    task.entry = recorded_entry(where)
    return task


__all__ = ["check_location", "entry_path", "load_stored_task", "load_task", "main_entry", "project_root",
           "recorded_entry", "same_location"]
