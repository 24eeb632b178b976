"""Type references for tagged values: how a stored ``"module:Qualname"`` finds its class again.

Loading never imports a module and never calls anything named by stored data. A type reference is
resolved in this order:

1. the explicit registry (:func:`register_type`, :func:`register_codec`), which also holds aliases
   for classes that were renamed or moved;
2. a module that is *already imported* (``sys.modules``), walked attribute by attribute through
   ``vars()`` (no ``__getattr__`` hooks, no descriptors).

The resolved object must be a class of the expected kind (an ``Enum`` for an ``enum`` tag, a
pydantic ``BaseModel`` for a ``model`` tag, ...), otherwise loading fails. The same lookup runs at
write time, so a class that could never be found again (defined inside a function, say) is refused
when it is saved, not discovered missing the night after.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from overnight.errors import EncodeError, UnknownTypeError

_lock = threading.Lock()
_registry: dict[str, type] = {}  # ref -> class (explicit registrations and aliases)
_codecs: dict[type, "CustomCodec"] = {}  # class -> custom codec
_codecs_by_name: dict[str, "CustomCodec"] = {}
_generation = 0  # bumped by every change above: a cache of encodings made under the old registry is stale


def generation() -> int:
    """A counter that changes whenever :func:`register_type`, :func:`register_codec` or
    :func:`forget_modules` changes what a class encodes to or decodes from: a cache of encoded or
    decoded values (:class:`~overnight.codec.listcodec.ListCodec`) made under another generation
    is dropped."""
    return _generation


def _changed() -> None:
    global _generation
    _generation += 1


@dataclass(frozen=True)
class CustomCodec:
    """A user codec for a type overnight does not cover: ``encode(obj) -> value``, ``decode(value) -> obj``.

    ``value`` may be anything overnight itself can encode (it is encoded recursively)."""

    name: str
    cls: type
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def file_module_name(path: str, module: Any = None) -> str:
    """The module name a task file's classes are recorded under, whichever way the file was
    started: its stem (``tasks/rt.py`` -> ``rt``), or ``overnight_task_<stem>`` when the stem is
    not an identifier or names another module already imported (``json.py``). ``module``: the
    module object the file runs as (``__main__`` for ``python FILE.py``), which may hold the name."""
    stem = path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    taken = sys.modules.get(stem)
    if stem.isidentifier() and (taken is None or (module is not None and taken is module)):
        return stem
    return f"overnight_task_{stem}"


def main_module_name() -> str | None:
    """For a process started as ``python FILE.py``: the name ``overnight run FILE.py`` gives the
    file's module (:func:`file_module_name`), so a class defined in it is recorded as ``rt:Color``
    either way, never ``__main__:Color``. None when ``__main__`` is not a ``.py`` file."""
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    if not isinstance(f, str) or not f.endswith(".py"):
        return None
    return file_module_name(f, main)


def type_ref(cls: type) -> str:
    """``"module:Qualname"`` for a class, e.g. ``"app.models:Report.Status"``; a class of a task
    file run as ``python FILE.py`` under the file's module name (:func:`main_module_name`)."""
    module = cls.__module__
    if module == "__main__":
        module = main_module_name() or module
    return f"{module}:{cls.__qualname__}"


def register_type(cls: type, *aliases: str) -> type:
    """Make ``cls`` resolvable on load under its own reference and every alias given.

    Use it for classes defined where overnight cannot walk to them (inside a function), or with
    the old ``"module:Qualname"`` as an alias after moving or renaming a class whose instances are
    stored. Returns ``cls`` so it can be used as a decorator.
    """
    with _lock:
        _registry[type_ref(cls)] = cls
        for alias in aliases:
            _registry[alias] = cls
        _changed()
    return cls


def register_codec(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], *, name: str | None = None) -> None:
    """Teach overnight a type it does not cover.

    Args:
        cls: the exact class (subclasses are not matched; register them separately).
        encode: ``obj -> value`` where ``value`` is encodable by overnight (str, dict, list, ...).
        decode: ``value -> obj``; must return an object equal to the original.
        name: stable tag name stored in checkpoints (default ``"module:Qualname"`` of ``cls``);
            keep it when the class moves, so old checkpoints still load.
    """
    codec = CustomCodec(name or type_ref(cls), cls, encode, decode)
    with _lock:
        _codecs[cls] = codec
        _codecs_by_name[codec.name] = codec
        _changed()


def forget_modules(names: set[str]) -> None:
    """Drop what :func:`register_type` and :func:`register_codec` registered for classes defined in
    the modules ``names`` -- a worker's session drops a task's own modules after the task, and the
    next task (which may define another class under the same name) registers its own."""
    with _lock:
        for ref in [r for r, cls in _registry.items() if getattr(cls, "__module__", None) in names]:
            del _registry[ref]
        for cls in [c for c in _codecs if getattr(c, "__module__", None) in names]:
            codec = _codecs.pop(cls)
            if _codecs_by_name.get(codec.name) is codec:
                del _codecs_by_name[codec.name]
        _changed()


def custom_codec_for(cls: type) -> CustomCodec | None:
    return _codecs.get(cls)


def custom_codec_named(name: str) -> CustomCodec | None:
    return _codecs_by_name.get(name)


def _walk(ref: str) -> Any:
    module_name, _, qualname = ref.partition(":")
    if not qualname:
        return None
    obj: Any = sys.modules.get(module_name)
    if obj is None and module_name == main_module_name():  # recorded by `overnight run FILE.py`
        obj = sys.modules.get("__main__")
    if obj is None:
        return None
    for part in qualname.split("."):
        if part == "<locals>":
            return None
        try:
            namespace = vars(obj)
        except TypeError:
            return None
        if part not in namespace:
            return None
        obj = namespace[part]
    return obj


def resolve(ref: str, kind: type, *, path: str) -> type:
    """Find the class named ``ref`` without importing anything; it must subclass ``kind``.

    Raises:
        UnknownTypeError: the class is not registered and its module is not imported, or the
            name now points at something that is not a ``kind`` subclass.
    """
    cls = _registry.get(ref)
    if cls is None:
        cls = _walk(ref)
    if not isinstance(cls, type) or not issubclass(cls, kind):
        module_name = ref.partition(":")[0]
        loaded = module_name in sys.modules
        why = (
            f"module {module_name!r} is imported but has no {kind.__name__} at that name"
            if loaded
            else f"module {module_name!r} is not imported in this process"
        )
        raise UnknownTypeError(
            f"cannot load {ref!r} at {path}: {why}",
            path=path,
            type_name=ref,
            hint=(
                "import the module that defines the class before resuming, or call "
                f"overnight.register_type(NewClass, {ref!r}) if it was moved or renamed"
            ),
        )
    return cls


def is_registered(cls: type) -> bool:
    """Was ``cls`` registered with :func:`register_type` or :func:`register_codec`?"""
    return cls in _codecs or any(registered is cls for registered in _registry.values())


def resolve_registered(ref: str, *, path: str, what: str) -> type:
    """Find the class ``ref`` among the classes registered with :func:`register_type` or
    :func:`register_codec` *only* -- never by walking imported modules: for tags whose class is
    called on load with no checks of its own (a ``defaultdict`` factory is called on every missing
    key), any imported class will not do (``subprocess:Popen`` is one).

    Raises:
        UnknownTypeError: ``ref`` is not a registered class.
    """
    cls = _registry.get(ref)
    if cls is None:
        cls = next((c.cls for c in _codecs.values() if type_ref(c.cls) == ref), None)
    if not isinstance(cls, type):
        raise UnknownTypeError(
            f"cannot load {ref!r} at {path}: {what} must be a builtin factory or a class registered with "
            "overnight.register_type (or register_codec); it is not", path=path, type_name=ref,
            hint="if you stored it, call overnight.register_type(TheClass) before resuming (refused otherwise: a "
            "store must not name code to call)")
    return cls


def resolvable_ref(cls: type) -> str | None:
    """The reference a value of ``cls`` is stored under -- one a load finds ``cls`` by again (its
    own, or an alias it was registered under) -- or None when no reference leads back to ``cls``
    (defined inside a function, or shadowed: its module's name now holds another class)."""
    ref = type_ref(cls)
    if _registry.get(ref) is cls or _walk(ref) is cls:
        return ref
    for alias, registered in _registry.items():
        if registered is cls:
            return alias
    return None


def check_resolvable(cls: type, kind: type, *, path: str) -> str:
    """Write-time twin of :func:`resolve`: refuse a class that could not be found again on load."""
    ref = resolvable_ref(cls)
    if ref is not None:
        return ref
    ref = type_ref(cls)
    raise EncodeError(
        f"cannot store {cls.__qualname__} at {path}: class {ref!r} could not be found again on load "
        "(defined inside a function, or shadowed)",
        path=path,
        type_name=ref,
        hint="define the class at module level, or call overnight.register_type(cls) before saving",
    )
