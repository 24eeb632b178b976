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

Faster still for the item *objects* a codec has seen -- encoded, or returned by its ``decode``: a
saver is handed the same message objects again at every checkpoint, so each is checked by identity
rather than pickled whole (a :class:`_Seen` snapshot). The item, its class, its members' keys and
values must be the very objects they were (``is``, never ``==``: ``1 == True`` but they encode
differently); the members that can change in place -- every value that is not a ``str``,
``int``, ``float``, ``bool``, ``bytes`` or ``None``, and a model's extra and private attributes --
must pickle to the same bytes as then (or, when they were all empty dicts, lists, sets or tuples,
still be empty), and a model's fields set must hold the same names. Anything else falls back to the
pickled state.

Decoding reuses an item only when the bytes to decode hold that item's exact bytes at the same
place as a list this codec decoded before; the rest is decoded normally. A decoded item is
returned as a fresh copy (``pickle.loads``), so a caller that changes it changes nothing kept.
"""

from __future__ import annotations

import itertools
import pickle
import threading
from operator import is_, itemgetter
from typing import Any, Callable, NamedTuple

from pydantic import BaseModel

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


def _exact(value: Any, depth: int = 0) -> bool:
    """Does the pickled state of ``value`` determine its canonical encoding (see the module docstring)?"""
    cls = type(value)
    if cls is str or cls is int or cls is float or cls is bool or value is None or cls is bytes:
        return True
    if depth > _MAX_WALK_DEPTH:
        return False
    if cls is list or cls is tuple:
        return all(_exact(v, depth + 1) for v in value)
    if cls is dict:
        return all(_exact(k, depth + 1) and _exact(v, depth + 1) for k, v in value.items())
    if isinstance(value, BaseModel) and _default_pickling(cls):
        parts = [value.__dict__, value.__pydantic_extra__ or {}, value.__pydantic_private__ or {}]
        return all(type(p) is dict and _exact(p, depth + 1) for p in parts)
    return False


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


_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})
"""Member value types whose identity fixes their value (nothing in them can change in place)."""
_EMPTIABLE = frozenset({dict, list, set, tuple})
"""Container types whose identity and emptiness fix their value."""


class _Seen(NamedTuple):
    """An item object as a codec last encoded or returned it: enough to tell, without pickling
    the whole item, that it still encodes to ``data`` (module docstring)."""

    item: Any
    """The object itself (kept alive, so its ``id`` is not reused while remembered)."""
    cls: type
    keys: tuple[Any, ...]
    """Its members' keys (a model's ``__dict__``, a dict's own), in order, as objects."""
    vals: tuple[Any, ...]
    """Its members' values in order, then a model's extra and private attributes, as objects."""
    fields: frozenset[str] | None
    """A model's fields set (None: a dict)."""
    mutable: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    """Picks, from ``vals``, the values that can change in place."""
    state: bytes | None
    """Pickle of those values; None when every one of them was an empty dict, list, set or tuple
    (then staying empty is staying the same)."""
    data: bytes
    """The item's canonical bytes."""


def _values(item: Any, model: bool) -> tuple[dict[Any, Any], tuple[Any, ...]]:
    """The members of ``item`` and the values :attr:`_Seen.vals` holds."""
    if model:
        members = item.__dict__
        return members, (*members.values(), item.__pydantic_extra__, item.__pydantic_private__)
    return item, tuple(item.values())


def _snapshot(item: Any, data: bytes) -> _Seen | None:
    """A :class:`_Seen` of ``item``, whose canonical bytes are ``data`` and whose whole value is
    :func:`_exact` (the caller checked); None for an item that is not a dict or a model."""
    cls = type(item)
    model = cls is not dict
    if model and _how.get(cls, (_NEVER,))[0] != _MODEL:
        return None
    members, vals = _values(item, model)
    where = [i for i, v in enumerate(vals) if type(v) not in _IMMUTABLE]
    pick: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    if len(where) > 1:
        pick = itemgetter(*where)
    else:
        pick = (lambda v, i=where[0]: (v[i],)) if where else (lambda v: ())
    mutable = pick(vals)
    if all(type(v) in _EMPTIABLE and not v for v in mutable):
        state = None
    else:
        try:
            state = pickle.dumps(mutable, pickle.HIGHEST_PROTOCOL)
        except Exception:  # unpicklable: left to the other paths
            return None
    fields = frozenset(item.__pydantic_fields_set__) if model else None
    return _Seen(item, cls, tuple(members), vals, fields, pick, state, data)


def _still(seen: _Seen, item: Any) -> bool:
    """Does ``item`` (the object ``seen`` was taken of) still encode to ``seen.data``?"""
    if type(item) is not seen.cls:
        return False
    model = seen.fields is not None
    members, vals = _values(item, model)
    if (len(vals) != len(seen.vals) or not all(map(is_, vals, seen.vals)) or not all(map(is_, members, seen.keys))
            or (model and item.__pydantic_fields_set__ != seen.fields)):
        return False
    mutable = seen.mutable(vals)
    if seen.state is None:
        return not any(mutable)
    try:
        return pickle.dumps(mutable, pickle.HIGHEST_PROTOCOL) == seen.state
    except Exception:
        return False


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
        self._seen: dict[int, _Seen] = {}
        """``id`` -> snapshot, for the item objects of recent lists (about the last :data:`KEEP`)."""

    def encode(self, value: Any, path: str = "value") -> bytes:
        """Canonical bytes of ``value`` (as :func:`~overnight.codec.canonical.encode`).

        Raises:
            EncodeError: as :func:`~overnight.codec.canonical.encode`.
        """
        if type(value) is not list or len(value) < MIN_ITEMS or not isinstance(value[0], _CONTAINERS):
            return encode(value, path)
        with self._lock:
            known, used, seen, now = self._encoded, {}, self._seen, {}
            parts = []
            for i, item in enumerate(value):
                snap = seen.get(id(item))
                if snap is not None and snap.item is item and _still(snap, item):
                    now[id(item)] = snap
                    parts.append(snap.data)
                    continue
                key = _key(item)
                got = None if key is None else known.get(key)
                if got is None:
                    got = dumps(to_tree(item, f"{path}[{i}]", depth=1))
                    if key is not None and _exact(item):
                        known[key] = got
                    else:
                        key = None
                if key is not None:
                    used[key] = got
                    snap = _snapshot(item, got)
                    if snap is not None:
                        now[id(item)] = snap
                parts.append(got)
            if len(known) > KEEP * len(used) + 1024:  # forget the items no recent list holds
                self._encoded = used
            seen.update(now)
            if len(seen) > KEEP * len(now) + 1024:
                self._seen = now
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
            reused: list[tuple[bytes, bytes]] = []
            pos = 1  # data[pos:] is what is left to decode, after "[" and the reused items' ","
            for old, items in self._decoded:
                n, at = 0, 1
                if data.startswith(memoryview(old)[:-1]) and data[len(old) - 1 : len(old)] == b",":  # an append
                    n, at = len(items), len(old)
                else:
                    for item, _ in items:
                        end = at + len(item)
                        if not data.startswith(item, at) or data[end : end + 1] not in (b",", b"]"):
                            break
                        n, at = n + 1, end + 1
                if n > len(reused):
                    reused, pos = items[:n], at
            try:
                rest = decode(b"[" + data[pos:], path) if pos < len(data) else []
            except DecodeError:  # raised again with the failing item's place in the whole list
                return decode(data, path)
            fresh = self._remember(data[pos:-1], rest) if len(reused) + len(rest) >= MIN_ITEMS else None
            out = [pickle.loads(p) for _, p in reused]
            self._note(out, [item for item, _ in reused])
            if fresh is not None:
                self._decoded = [(data, reused + fresh), *(d for d in self._decoded if d[0] != data)][:KEEP]
        return out + rest

    def _note(self, values: list[Any], data: list[bytes]) -> None:
        """Remember the objects ``decode`` returns (``values``, whose canonical bytes are ``data``),
        so that encoding them again -- a saver handed back what it loaded -- is checked by
        identity. Every one of them is :func:`_exact` (it was remembered so)."""
        seen = self._seen
        for v, d in zip(values, data):
            snap = _snapshot(v, d)
            if snap is not None:
                seen[id(v)] = snap
        if len(seen) > (KEEP + 1) * len(values) + 1024:
            self._seen = {id(v): seen[id(v)] for v in values if id(v) in seen}

    @staticmethod
    def _remember(text: bytes, values: list[Any]) -> list[tuple[bytes, bytes]] | None:
        """``(item bytes, pickled value)`` of freshly decoded items whose bytes ``text`` joins
        (None: one of them cannot be remembered exactly, or the bytes do not split so)."""
        if len(text) < MIN_ITEM_BYTES * len(values):
            return None
        out = []
        for v in values:
            if not _exact(v):
                return None
            out.append((encode(v), pickle.dumps(v, pickle.HIGHEST_PROTOCOL)))
        if b",".join(item for item, _ in out) != text:
            return None
        return out
