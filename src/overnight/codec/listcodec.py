"""Canonical encoding and decoding of growing lists in time proportional to what changed.

A LangGraph message list, an agent transcript: each checkpoint stores the list again with one or
two items more. :func:`overnight.codec.canonical.encode` walks every item every time; a
:class:`ListCodec` encodes and decodes such a list item by item and remembers the items of its
last calls, so only new or changed items are converted. The bytes and values are exactly those of
:func:`~overnight.codec.canonical.encode` / :func:`~overnight.codec.canonical.decode` (a JSON
array is ``[`` + its items' canonical bytes joined by ``,`` + ``]``; tests/test_listcodec.py).

How it knows an item did not change, exactly and cheaply: by its *state* as :mod:`pickle` writes
it (C speed, every type and value and the order of dict members included; for a pydantic model,
its class, fields, fields set, extra and private attributes). An item is remembered only when its
whole value is made of types whose pickled state determines their canonical encoding: ``str``,
``int``, ``float``, ``bool``, ``None``, ``bytes``, ``list``, ``tuple``, ``dict`` and pydantic
models that keep pydantic's own pickling; anything else is converted on every call. Pickle is
only a key and an in-memory copy here: nothing pickled is stored, and nothing is unpickled that
this process did not pickle itself from a value it decoded.

Decoding reuses an item only when the bytes to decode hold that item's exact bytes at the same
place as a list this codec decoded before; the rest is decoded normally. A decoded item is
returned as a fresh copy (``pickle.loads``), so a caller that changes it changes nothing kept.

What is remembered was made under the type registry of its time: a codec forgets everything when a
type or codec is registered or forgotten since (:func:`~overnight.codec.registry.generation`), or
when a model class its items hold can no longer be found by its name (a notebook cell that
defines the class again) -- the canonical codec would then refuse to store such an item, or load
it as the class the registry names, and a remembered value would come back as the new class
without its checks. Items of a class its name does not lead to (defined in a function) are not
remembered.
"""

from __future__ import annotations

import itertools
import pickle
import sys
import threading
from typing import Any

from pydantic import BaseModel

from overnight.codec import registry
from overnight.codec.canonical import decode, dumps, encode, to_tree
from overnight.errors import DecodeError

MIN_ITEMS = 8
"""Lists shorter than this are encoded and decoded whole (nothing worth remembering)."""
MIN_ITEM_BYTES = 32
"""Decoded lists whose items average fewer bytes are not remembered (a list of numbers decodes
faster whole than item by item)."""
_CONTAINERS = (BaseModel, dict, list, tuple)
"""Lists are encoded item by item when their first item is one of these (messages, records);
a list of scalars is encoded whole."""
KEEP = 4
"""Lists remembered per codec, about (a saver writes several channels, and reads older checkpoints)."""
_MAX_WALK_DEPTH = 40
"""Items nested deeper than this are not remembered (converted on every call)."""


def _default_pickling(cls: type) -> bool:
    """Does pydantic model class ``cls`` pickle its instances as pydantic does (its state: fields,
    fields set, extra, private)?"""
    return (cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and cls.__getstate__ is BaseModel.__getstate__ and cls.__setstate__ is BaseModel.__setstate__
            and not hasattr(cls, "__getnewargs_ex__") and not hasattr(cls, "__getnewargs__"))


def _exact(value: Any, classes: set[type], depth: int = 0) -> bool:
    """Does the pickled state of ``value`` determine its canonical encoding (see the module
    docstring)? Adds the model classes it holds to ``classes`` (its bytes name them)."""
    cls = type(value)
    if cls is str or cls is int or cls is float or cls is bool or value is None or cls is bytes:
        return True
    if depth > _MAX_WALK_DEPTH:
        return False
    if cls is list or cls is tuple:
        return all(_exact(v, classes, depth + 1) for v in value)
    if cls is dict:
        return all(_exact(k, classes, depth + 1) and _exact(v, classes, depth + 1) for k, v in value.items())
    if isinstance(value, BaseModel) and _default_pickling(cls) and _by_name(cls):
        classes.add(cls)
        parts = [value.__dict__, value.__pydantic_extra__ or {}, value.__pydantic_private__ or {}]
        return all(type(p) is dict and _exact(p, classes, depth + 1) for p in parts)
    return False


def _by_name(cls: type) -> bool:
    """Does its module's name lead to ``cls`` -- what :mod:`pickle` looks up to make an object of it
    again? Not for a class defined inside a function, nor for one shadowed since (a notebook cell
    that defines the class again), even when registered (:func:`~overnight.codec.registry.register_type`)."""
    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


_MODEL, _PLAIN, _NEVER = 1, 2, 0
_serial = itertools.count()
_how: dict[type, tuple[int, str]] = {}
"""Per item class (kept alive here): its state is a pydantic model's (:data:`_MODEL`), the item
itself (:data:`_PLAIN`), or it is never remembered (:data:`_NEVER`); and a name for it unique in
this process (a model's state names its class by it: cheaper than pickling the class)."""


def _key(item: Any) -> bytes | None:
    """The pickled state of ``item`` (None: not one to remember)."""
    cls = type(item)
    how = _how.get(cls)
    if how is None:
        if issubclass(cls, BaseModel):
            kind = _MODEL if _default_pickling(cls) else _NEVER
        else:
            kind = _PLAIN if cls in (str, int, float, bool, bytes, list, tuple, dict, type(None)) else _NEVER
        how = _how[cls] = (kind, f"{cls.__module__}:{cls.__qualname__}#{next(_serial)}")
    try:
        if how[0] == _MODEL:
            return pickle.dumps((how[1], item.__dict__, item.__pydantic_fields_set__, item.__pydantic_extra__,
                                 item.__pydantic_private__), pickle.HIGHEST_PROTOCOL)
        if how[0] == _PLAIN:
            return pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
    except Exception:  # unpicklable: converted on every call
        pass
    return None


class ListCodec:
    """``encode`` / ``decode`` as in :mod:`overnight.codec.canonical`, incremental for lists.

    Safe to share between threads (one lock). Memory: about two copies of the last :data:`KEEP`
    lists' items (their bytes and state).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._encoded: dict[bytes, bytes] = {}
        """Item state -> item bytes, for the items of recent lists (about the last :data:`KEEP`)."""
        self._decoded: list[tuple[bytes, list[tuple[bytes, bytes]]]] = []
        """Per remembered decoded list: its bytes and, per item, ``(item bytes, pickled value)``."""
        self._classes: set[type] = set()
        """The model classes remembered items hold (or held)."""
        self._generation = registry.generation()
        """The type registry's generation the remembered items were made under."""

    def _check_registry(self) -> None:
        """Forget everything remembered when the registry changed since, or when one of the model
        classes remembered items hold was shadowed (see the module docstring). A few dict look-ups
        per class and call. Call with the lock held."""
        now = registry.generation()
        if now != self._generation or any(not _by_name(c) or registry.resolvable_ref(c) is None for c in self._classes):
            self._encoded, self._decoded, self._classes, self._generation = {}, [], set(), now

    def encode(self, value: Any, path: str = "value") -> bytes:
        """Canonical bytes of ``value`` (as :func:`~overnight.codec.canonical.encode`).

        Raises:
            EncodeError: as :func:`~overnight.codec.canonical.encode`.
        """
        if type(value) is not list or len(value) < MIN_ITEMS or not isinstance(value[0], _CONTAINERS):
            return encode(value, path)
        with self._lock:
            self._check_registry()
            known, used = self._encoded, {}
            parts = []
            for i, item in enumerate(value):
                key = _key(item)
                got = None if key is None else known.get(key)
                if got is None:
                    got = dumps(to_tree(item, f"{path}[{i}]", depth=1))
                    if key is not None and _exact(item, self._classes):
                        known[key] = got
                    else:
                        key = None
                if key is not None:
                    used[key] = got
                parts.append(got)
            if len(known) > KEEP * len(used) + 1024:  # forget the items no recent list holds
                self._encoded = used
        parts[0], parts[-1] = b"[" + parts[0], parts[-1] + b"]"  # (MIN_ITEMS >= 2) one copy of the whole list, not three
        return b",".join(parts)

    def decode(self, data: bytes, path: str = "value") -> Any:
        """The value ``data`` encodes (as :func:`~overnight.codec.canonical.decode`), each item a
        fresh object.

        Raises:
            DecodeError, UnknownTypeError: as :func:`~overnight.codec.canonical.decode`.
        """
        if not data.startswith(b"[") or not data.endswith(b"]"):
            return decode(data, path)
        with self._lock:
            self._check_registry()
            reused: list[tuple[bytes, bytes]] = []
            pos = 1  # data[pos:] is what is left to decode, after "[" and the reused items' ","
            for old, items in self._decoded:
                n, at = 0, 1
                if data.startswith(memoryview(old)[:-1]) and data[len(old) - 1 : len(old)] == b",":  # an append
                    n, at = len(items), len(old)
                else:
                    for item, _ in items:
                        end = at + len(item)
                        # an item is followed by "," and another item, or by the list's final "]"
                        if not data.startswith(item, at) or not (data[end : end + 1] == b"," or end + 1 == len(data)):
                            break
                        n, at = n + 1, end + 1
                if n > len(reused):
                    reused, pos = items[:n], at
            if pos < len(data) and data[pos - 1 : pos] == b"," and data[pos:] == b"]":  # "[...,]": not JSON
                return decode(data, path)  # raises the codec's own error
            try:
                rest = decode(b"[" + data[pos:], path) if pos < len(data) else []
            except DecodeError:  # raised again with the failing item's place in the whole list
                return decode(data, path)
            fresh = (self._remember(data[pos:-1], rest, self._classes) if len(reused) + len(rest) >= MIN_ITEMS
                     else None)
            out = [pickle.loads(p) for _, p in reused]
            if fresh is not None:
                self._decoded = [(data, reused + fresh), *(d for d in self._decoded if d[0] != data)][:KEEP]
        return out + rest

    @staticmethod
    def _remember(text: bytes, values: list[Any], classes: set[type]) -> list[tuple[bytes, bytes]] | None:
        """``(item bytes, pickled value)`` of freshly decoded items whose bytes ``text`` joins
        (None: one of them cannot be remembered exactly, or the bytes do not split so); the model
        classes they hold are added to ``classes``."""
        if len(text) < MIN_ITEM_BYTES * len(values):
            return None
        out = []
        for v in values:
            if not _exact(v, classes):
                return None
            try:
                kept = pickle.dumps(v, pickle.HIGHEST_PROTOCOL)
            except Exception:  # a class pickle cannot find again: decoded whole every time, as the codec does
                return None
            out.append((encode(v), kept))
        if b",".join(item for item, _ in out) != text:
            return None
        return out
