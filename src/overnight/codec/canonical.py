# Over 600 lines: one format: the canonical JSON encoder, its strict decoder and the tree conversion they share (split would separate code that must change together).
"""Canonical JSON: the one encoding of every value overnight stores (spec: ``docs/FORMAT.md``).

Two layers:

* :func:`to_tree` / :func:`from_tree` map Python values to a JSON tree of ``None | bool | int |
  float | str | list | dict[str, ...]`` and back. Values JSON has no exact form for become
  *tagged objects* ``{"$t": TAG, ...}`` (bytes, tuple, set, datetime, Decimal, Enum, pydantic
  models, ...). A value no codec covers is refused at write time with :class:`EncodeError`
  naming its path (``state.data.items[3].when``) and type.
* :func:`dumps` / :func:`loads` turn a tree into canonical bytes: ASCII-only JSON (every non-ASCII
  code point is a ``\\uXXXX`` escape, so U+0000, U+2028/2029, lone surrogates, CJK and emoji all
  take the same path and round-trip exactly), ``","``/``":"`` separators, no NaN/Infinity.

Object members keep the insertion order of the mapping they came from: Python dicts are ordered and
that order is part of the value. Records overnight itself writes are built with sorted keys, so
they are canonical in the RFC 8785 sense too. Loading never imports or calls anything named by
stored data (see :mod:`overnight.codec.registry`) and fails as a whole on any value it cannot decode.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as dt
import decimal
import enum
import fractions
import json
import math
import pathlib
import re
import struct
import uuid
import zoneinfo
from typing import Any

import orjson

from overnight.codec import registry as _types
from overnight.errors import DecodeError, EncodeError, UnknownTypeError

TAG = "$t"

MAX_DEPTH = 100
"""Containers a stored value may nest (a list in a dict in a model ... counts each). Deeper values are
refused at write time: decoding takes more Python stack per level than encoding, so without a limit
a value could be stored that no process can load again. 100 leaves room below Python's default
recursion limit (1000) for the decoder's up to 3 frames per level plus the caller's stack."""

# int beyond this many digits exceeds CPython's int<->str limit (sys.int_info.default_max_str_digits)
_MAX_INT_DIGITS = 4000
_BIG = 10**_MAX_INT_DIGITS
_BIG_FAST = 2**63  # ints the encoder's inline path passes through without the range check above
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")

# defaultdict factories stored by name; anything else must be a registered type.
_FACTORIES: dict[str, Any] = {
    "list": list,
    "dict": dict,
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "int": int,
    "float": float,
    "str": str,
    "bytes": bytes,
    "bool": bool,
    "OrderedDict": collections.OrderedDict,
    "Counter": collections.Counter,
    "deque": collections.deque,
}
_FACTORY_NAMES = {v: k for k, v in _FACTORIES.items()}


# Paths are built lazily -- ``(parent, kind, part)`` tuples -- and rendered only for an error
# message: formatting a path string for every value would dominate the encoder's cost.
_KEY, _IDX, _ATTR, _RAW = 0, 1, 2, 3
Path = Any  # str (the root) or (parent, kind, part)


def fmt_path(path: Path) -> str:
    """Render a lazy path: ``state.data.items[3].when``."""
    parts: list[str] = []
    while isinstance(path, tuple):
        path, kind, part = path
        if kind == _KEY:
            parts.append(f".{part}" if isinstance(part, str) and _IDENT.match(part) else f"[{part!r}]")
        elif kind == _IDX:
            parts.append(f"[{part}]")
        elif kind == _ATTR:
            parts.append(f".{part}")
        else:
            parts.append(part)
    return path + "".join(reversed(parts))


_F64 = struct.Struct("<d")
_NAN_BITS = _F64.pack(float("nan"))
_NAN_HEX = re.compile(r"[0-9a-f]{16}")
"""The NaN a stored ``{"$t": "float", "v": "nan"}`` decodes to (``0x7ff8000000000000``). Any other
NaN -- the sign bit set (what ``inf - inf`` gives on x86), a payload -- is stored with ``bits``
(16 hex digits, big-endian IEEE 754) and decodes to the same bits."""


def _refuse(value: Any, path: Path, why: str = "", hint: str | None = None) -> EncodeError:
    cls = type(value)
    name = f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__qualname__
    where = fmt_path(path)
    return EncodeError(
        f"cannot store value of type {name} at {where}{': ' + why if why else ''}",
        path=where,
        type_name=name,
        hint=hint
        or "convert it to a supported type (str, int, float, bool, None, list, dict, tuple, set, bytes, "
        "datetime, Decimal, UUID, Enum, pydantic model, dataclass) or call overnight.register_codec",
    )


# --- encode ------------------------------------------------------------------------------------


def to_tree(value: Any, path: str = "value", *, depth: int = 0) -> Any:
    """Encode ``value`` into a JSON tree. ``depth``: how many containers ``value`` sits in (an
    item of a list encoded on its own passes 1, so the :data:`MAX_DEPTH` limit is the list's).

    Raises:
        EncodeError: a value (at any depth) has no codec; the message names its path and type.
            Also for a value that contains itself, or nests more than :data:`MAX_DEPTH` containers.
    """
    try:
        return _enc(value, path, depth)
    except (_TooDeep, RecursionError) as exc:
        cycle = _find_cycle(value, path)
        if cycle is not None:
            raise _refuse(cycle[0], cycle[1], "it contains itself (reference cycle)",
                          hint="store a copy without the cycle (JSON has no references)") from None
        where = fmt_path(exc.path) if isinstance(exc, _TooDeep) else path
        short = where if len(where) <= 160 else f"{where[:70]}...{where[-70:]}"
        raise EncodeError(f"cannot store the value at {short}: it is nested more than {MAX_DEPTH} containers deep",
                          path=where, hint="flatten it (a list of records with parent ids instead of a deep tree), "
                          "or store it as an artifact") from None


def _children(value: Any, path: Path):
    if isinstance(value, dict):
        return [(v, (path, _KEY, k)) for k, v in value.items()]
    if isinstance(value, (list, tuple, collections.deque)):
        return [(v, (path, _IDX, i)) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [(v, (path, _RAW, "{}")) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(getattr(value, f.name), (path, _ATTR, f.name)) for f in dataclasses.fields(value)]
    model_base = _pydantic_base()
    if model_base is not None and isinstance(value, model_base):
        return [(getattr(value, n), (path, _ATTR, n)) for n in type(value).model_fields]
    return []


def _find_cycle(value: Any, path: Path) -> tuple[Any, Path] | None:
    """The first container (and its path) that contains itself, by iterative DFS."""
    stack = [(value, path, frozenset())]
    while stack:
        v, p, ancestors = stack.pop()
        if id(v) in ancestors:
            return v, p
        children = _children(v, p)
        if children:
            inner = ancestors | {id(v)}
            stack.extend((c, cp, inner) for c, cp in children)
    return None


def _str(value: str) -> Any:
    # JSON's \\uD83E\\uDDEA means one astral code point; a str holding the two surrogate code points
    # would come back as a different string, so such strings are stored as surrogatepass bytes.
    if not value.isascii() and _SURROGATE_PAIR.search(value):
        return {TAG: "str", "b64": base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii")}
    return value


def _pairs(items, path: Path, d: int) -> list:
    return [[_enc(k, (path, _RAW, "<key>"), d), _enc(v, (path, _KEY, k), d)] for k, v in items]


class _TooDeep(Exception):
    """Raised inside the encoder at :data:`MAX_DEPTH`; :func:`to_tree` turns it into EncodeError."""

    def __init__(self, path: Path) -> None:
        self.path = path


def _enc(value: Any, path: Path, d: int = 0) -> Any:
    """``d``: how many containers ``value`` sits in (refused beyond :data:`MAX_DEPTH`)."""
    cls = type(value)
    if cls is str:
        return value if value.isascii() or not _SURROGATE_PAIR.search(value) else _str(value)
    if cls is dict:
        d += 1
        if d > MAX_DEPTH:
            raise _TooDeep(path)
        out = {}
        for k, v in value.items():
            if type(k) is not str or k == TAG or not (k.isascii() or not _SURROGATE_PAIR.search(k)):
                return {TAG: "dict", "items": _pairs(value.items(), path, d)}
            # inline for the common leaves (ASCII text, small ints, None): no call, no path built
            vc = type(v)
            if (vc is str and v.isascii()) or v is None or (vc is int and -_BIG_FAST < v < _BIG_FAST):
                out[k] = v
            else:
                out[k] = _enc(v, (path, _KEY, k), d)
        return out
    if cls is list:
        d += 1
        if d > MAX_DEPTH:
            raise _TooDeep(path)
        return [v if (type(v) is str and v.isascii()) or v is None else _enc(v, (path, _IDX, i), d)
                for i, v in enumerate(value)]
    if value is None or cls is bool:
        return value
    if cls is int:
        if -_BIG < value < _BIG:
            return value
        return {TAG: "int", "hex": hex(value)}
    if cls is float:
        if math.isfinite(value):
            return value
        if value != value and _F64.pack(value) != _NAN_BITS:  # -nan (x86's inf - inf), a payload: kept exactly
            return {TAG: "float", "v": "nan", "bits": _F64.pack(value)[::-1].hex()}
        return {TAG: "float", "v": repr(value)}  # 'nan', 'inf', '-inf'
    d += 1
    if d > MAX_DEPTH:
        raise _TooDeep(path)

    custom = _types.custom_codec_for(cls)
    if custom is not None:
        return {TAG: "custom", "name": custom.name, "v": _enc(custom.encode(value), (path, _RAW, f"<{custom.name}>"), d)}

    if cls is tuple:
        return {TAG: "tuple", "items": [_enc(v, (path, _IDX, i), d) for i, v in enumerate(value)]}
    if cls is set or cls is frozenset:
        items = [_enc(v, (path, _RAW, "{}"), d) for v in value]
        items.sort(key=dumps)  # deterministic: order by canonical bytes
        return {TAG: "set" if cls is set else "frozenset", "items": items}
    if cls is bytes or cls is bytearray:
        return {TAG: cls.__name__, "b64": base64.b64encode(value).decode("ascii")}

    if cls is dt.datetime:
        return _enc_clock(value, "datetime", path)
    if cls is dt.date:
        return {TAG: "date", "v": value.isoformat()}
    if cls is dt.time:
        return _enc_clock(value, "time", path)
    if cls is dt.timedelta:
        return {TAG: "timedelta", "days": value.days, "seconds": value.seconds, "us": value.microseconds}
    if cls is decimal.Decimal:
        return {TAG: "decimal", "v": str(value)}
    if cls is uuid.UUID:
        return {TAG: "uuid", "v": str(value)}
    if cls is complex:
        return {TAG: "complex", "re": _enc(value.real, path, d), "im": _enc(value.imag, path, d)}
    if cls is fractions.Fraction:
        return {TAG: "fraction", "v": str(value)}
    if cls in (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath):
        return {TAG: "path", "flavour": "windows" if isinstance(value, pathlib.PureWindowsPath) else "posix",
                "concrete": cls in (pathlib.PosixPath, pathlib.WindowsPath), "v": str(value)}

    if cls is collections.OrderedDict:
        return {TAG: "OrderedDict", "items": _pairs(value.items(), path, d)}
    if cls is collections.Counter:
        return {TAG: "Counter", "items": _pairs(value.items(), path, d)}
    if cls is collections.defaultdict:
        factory = value.default_factory
        if factory is None:
            name = None
        elif factory in _FACTORY_NAMES:
            name = _FACTORY_NAMES[factory]
        elif isinstance(factory, type) and _types.is_registered(factory):
            name = "type:" + _types.check_resolvable(factory, object, path=fmt_path((path, _ATTR, "default_factory")))
        else:
            raise _refuse(
                value, path, f"its default_factory {factory!r} cannot be stored",
                hint="use a builtin factory (list, dict, set, int, ...) or a class registered with "
                "overnight.register_type (a stored factory is called on load, so it must be one you registered)",
            )
        return {TAG: "defaultdict", "factory": name, "items": _pairs(value.items(), path, d)}
    if cls is collections.deque:
        return {TAG: "deque", "maxlen": value.maxlen, "items": [_enc(v, (path, _IDX, i), d) for i, v in enumerate(value)]}

    if isinstance(value, enum.Enum):
        ref = _types.check_resolvable(cls, enum.Enum, path=fmt_path(path))
        return {TAG: "enum", "cls": ref, "v": _enc(value.value, (path, _ATTR, "value"), d)}

    model_base = _pydantic_base()
    if model_base is not None and isinstance(value, model_base):
        return _enc_model(value, path, d)

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        ref = _types.check_resolvable(cls, object, path=fmt_path(path))
        fields = [[f.name, _enc(getattr(value, f.name), (path, _ATTR, f.name), d)] for f in dataclasses.fields(value)]
        return {TAG: "dataclass", "cls": ref, "fields": fields}

    if isinstance(value, tuple) and hasattr(cls, "_fields"):  # namedtuple
        ref = _types.check_resolvable(cls, tuple, path=fmt_path(path))
        return {TAG: "namedtuple", "cls": ref, "items": [_enc(v, (path, _ATTR, n), d) for n, v in zip(cls._fields, value)]}

    raise _refuse(value, path)


def _tz_extra(tz: dt.tzinfo, path: Path) -> dict:
    path = fmt_path(path)
    if isinstance(tz, zoneinfo.ZoneInfo):
        if tz.key is None:
            raise EncodeError(
                f"cannot store a ZoneInfo built from a file (no key) at {path}", path=path, type_name="zoneinfo.ZoneInfo"
            )
        return {"zone": tz.key}
    if isinstance(tz, dt.timezone):
        offset = tz.utcoffset(None)
        out: dict[str, Any] = {}
        if offset.microseconds:  # isoformat's +HH:MM:SS.ffffff does not parse back exactly on 3.11
            out["offset_us"] = (offset.days * 86400 + offset.seconds) * 1_000_000 + offset.microseconds
        if tz is not dt.timezone.utc and tz.tzname(None) != dt.timezone(offset).tzname(None):
            out["tzname"] = _str(tz.tzname(None))
        return out
    raise EncodeError(
        f"cannot store tzinfo {type(tz).__module__}.{type(tz).__qualname__} at {path}",
        path=path,
        type_name=f"{type(tz).__module__}.{type(tz).__qualname__}",
        hint="use zoneinfo.ZoneInfo or datetime.timezone",
    )


def _enc_clock(value: dt.datetime | dt.time, tag: str, path: Path) -> dict:
    out: dict[str, Any] = {TAG: tag, "v": value.isoformat()}
    if value.tzinfo is not None:
        out.update(_tz_extra(value.tzinfo, path))
    if value.fold:
        out["fold"] = 1
    return out


def _pydantic_base():
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return None
    return BaseModel


def _enc_model(value: Any, path: Path, d: int) -> dict:
    cls = type(value)
    base = _pydantic_base()
    ref = _types.check_resolvable(cls, base, path=fmt_path(path))
    fields = [[name, _enc(getattr(value, name), (path, _ATTR, name), d)] for name in cls.model_fields]
    out: dict[str, Any] = {TAG: "model", "cls": ref, "fields": fields}
    extra = value.__pydantic_extra__
    if extra:
        out["extra"] = _pairs(extra.items(), path, d)
    fields_set = value.model_fields_set
    if fields_set != set(cls.model_fields) | set(extra or {}):
        out["set"] = sorted(fields_set)
    private = value.__pydantic_private__
    if private:
        out["private"] = _pairs(private.items(), (path, _RAW, "<private>"), d)
    return out


# --- decode ------------------------------------------------------------------------------------


def from_tree(tree: Any, path: str = "value") -> Any:
    """Decode a JSON tree produced by :func:`to_tree`.

    Raises:
        DecodeError: malformed tag, unknown tag, or a value that does not decode exactly.
        UnknownTypeError: a class named by the data is not registered or imported.
    """
    try:
        return _dec(tree, path)
    except RecursionError:
        raise DecodeError(f"cannot decode stored value at {path}: nested too deeply (overnight writes at most "
                          f"{MAX_DEPTH} levels)", path=path) from None


def _bad(path: Path, why: str) -> DecodeError:
    where = fmt_path(path)
    return DecodeError(f"cannot decode stored value at {where}: {why}", path=where)


def _need(tree: dict, path: Path, *keys: str, optional: tuple[str, ...] = ()) -> None:
    extra = set(tree) - {TAG, *keys, *optional}
    missing = [k for k in keys if k not in tree]
    if missing or extra:
        raise _bad(path, f"tag {tree.get(TAG)!r} has missing {missing} / unexpected {sorted(extra)} members")


def _dec(tree: Any, path: Path) -> Any:
    cls = type(tree)
    if cls is str or tree is None or cls is int or cls is float or cls is bool:
        return tree
    if cls is list:
        return [_dec(v, (path, _IDX, i)) for i, v in enumerate(tree)]
    if cls is not dict:
        raise _bad(path, f"unexpected JSON type {cls.__name__}")
    tag = tree.get(TAG)
    if tag is None:
        return {k: _dec(v, (path, _KEY, k)) for k, v in tree.items()}
    if not isinstance(tag, str):
        raise _bad(path, "tag is not a string")
    fn = _DECODERS.get(tag)
    if fn is None:
        raise _bad(path, f"unknown tag {tag!r} (written by a newer overnight?)")
    try:
        return fn(tree, path)
    except (DecodeError, RecursionError):
        raise
    except Exception as exc:  # malformed member values: wrong types, bad base64, bad isoformat ...
        raise _bad(path, f"{tag!r}: {type(exc).__name__}: {exc}") from exc


def _dec_pairs(items: Any, path: Path) -> list[tuple[Any, Any]]:
    if not isinstance(items, list):
        raise _bad(path, "items is not a list")
    out = []
    keys: set[Any] = set()
    for pair in items:
        if not isinstance(pair, list) or len(pair) != 2:
            raise _bad(path, "item is not a [key, value] pair")
        k = _dec(pair[0], (path, _RAW, "<key>"))
        if k in keys:
            raise _bad(path, f"key {k!r} appears twice")
        keys.add(k)
        out.append((k, _dec(pair[1], (path, _KEY, k))))
    return out


def _d_items(tree: dict, path: Path) -> list:
    items = tree["items"]
    if not isinstance(items, list):
        raise _bad(path, "items is not a list")
    return [_dec(v, (path, _IDX, i)) for i, v in enumerate(items)]


def _d_str(t, p):
    _need(t, p, "b64")
    return base64.b64decode(t["b64"], validate=True).decode("utf-8", "surrogatepass")


def _d_int(t, p):
    _need(t, p, "hex")
    return int(t["hex"], 16)


def _d_float(t, p):
    _need(t, p, "v", optional=("bits",))
    if t["v"] not in ("nan", "inf", "-inf"):
        raise _bad(p, f"non-finite float {t['v']!r}")
    if "bits" not in t:
        return float(t["v"])
    bits = t["bits"]
    if t["v"] != "nan" or type(bits) is not str or not _NAN_HEX.fullmatch(bits):
        raise _bad(p, f"float bits {bits!r}: 16 lowercase hex digits of a NaN other than float('nan')")
    value = _F64.unpack(bytes.fromhex(bits)[::-1])[0]
    if value == value or _F64.pack(value) == _NAN_BITS:  # not a NaN, or the NaN written without bits
        raise _bad(p, f"float bits {bits!r}: 16 lowercase hex digits of a NaN other than float('nan')")
    return value


def _d_dict(t, p):
    _need(t, p, "items")
    out = {}
    for k, v in _dec_pairs(t["items"], p):
        out[k] = v
    return out


def _d_tuple(t, p):
    _need(t, p, "items")
    return tuple(_d_items(t, p))


def _d_set(t, p):
    _need(t, p, "items")
    return set(_d_items(t, p))


def _d_frozenset(t, p):
    _need(t, p, "items")
    return frozenset(_d_items(t, p))


def _d_bytes(t, p):
    _need(t, p, "b64")
    return base64.b64decode(t["b64"], validate=True)


def _d_bytearray(t, p):
    return bytearray(_d_bytes(t, p))


def _with_tz(t: dict, value: Any) -> Any:
    """Re-attach a named zone / exact or named fixed offset, and the fold, to a parsed datetime or time."""
    if "zone" in t:
        value = value.replace(tzinfo=zoneinfo.ZoneInfo(t["zone"]))
    elif "tzname" in t or "offset_us" in t:
        offset = dt.timedelta(microseconds=t["offset_us"]) if "offset_us" in t else value.utcoffset()
        tz = dt.timezone(offset, _dec(t["tzname"], "tzname")) if "tzname" in t else dt.timezone(offset)
        value = value.replace(tzinfo=tz)
    if t.get("fold"):
        value = value.replace(fold=1)
    return value


def _d_datetime(t, p):
    _need(t, p, "v", optional=("zone", "tzname", "offset_us", "fold"))
    return _with_tz(t, dt.datetime.fromisoformat(t["v"]))


def _d_date(t, p):
    _need(t, p, "v")
    return dt.date.fromisoformat(t["v"])


def _d_time(t, p):
    _need(t, p, "v", optional=("zone", "tzname", "offset_us", "fold"))
    return _with_tz(t, dt.time.fromisoformat(t["v"]))


def _d_timedelta(t, p):
    _need(t, p, "days", "seconds", "us")
    return dt.timedelta(days=t["days"], seconds=t["seconds"], microseconds=t["us"])


def _d_decimal(t, p):
    _need(t, p, "v")
    return decimal.Decimal(t["v"])


def _d_uuid(t, p):
    _need(t, p, "v")
    return uuid.UUID(t["v"])


def _d_complex(t, p):
    _need(t, p, "re", "im")
    return complex(_dec(t["re"], p), _dec(t["im"], p))


def _d_fraction(t, p):
    _need(t, p, "v")
    return fractions.Fraction(t["v"])


def _d_path(t, p):
    _need(t, p, "flavour", "concrete", "v")
    windows = t["flavour"] == "windows"
    if t["concrete"]:
        cls = pathlib.WindowsPath if windows else pathlib.PosixPath
        if cls is not type(pathlib.Path()):
            raise _bad(p, f"a concrete {cls.__name__} cannot be created on this platform")
    else:
        cls = pathlib.PureWindowsPath if windows else pathlib.PurePosixPath
    return cls(t["v"])


def _d_ordereddict(t, p):
    _need(t, p, "items")
    return collections.OrderedDict(_dec_pairs(t["items"], p))


def _d_counter(t, p):
    _need(t, p, "items")
    out: collections.Counter = collections.Counter()
    for k, v in _dec_pairs(t["items"], p):
        out[k] = v
    return out


def _d_defaultdict(t, p):
    _need(t, p, "factory", "items")
    name = t["factory"]
    if name is None:
        factory = None
    elif isinstance(name, str) and name.startswith("type:"):
        factory = _types.resolve_registered(name[5:], path=fmt_path((p, _ATTR, "default_factory")),
                                            what="a defaultdict factory")
    elif name in _FACTORIES:
        factory = _FACTORIES[name]
    else:
        raise _bad(p, f"unknown defaultdict factory {name!r}")
    out = collections.defaultdict(factory)
    for k, v in _dec_pairs(t["items"], p):
        out[k] = v
    return out


def _d_deque(t, p):
    _need(t, p, "maxlen", "items")
    return collections.deque(_d_items(t, p), maxlen=t["maxlen"])


def _d_enum(t, p):
    _need(t, p, "cls", "v")
    cls = _types.resolve(t["cls"], enum.Enum, path=fmt_path(p))
    raw = _dec(t["v"], (p, _ATTR, "value"))
    try:
        return cls(raw)
    except ValueError as exc:
        raise DecodeError(
            f"cannot decode stored value at {fmt_path(p)}: {t['cls']!r} has no member with value {raw!r}",
            path=fmt_path(p),
            type_name=t["cls"],
            hint="the enum changed since the checkpoint was written; register a codec or roll back the code",
        ) from exc


def _d_model(t, p):
    _need(t, p, "cls", "fields", optional=("extra", "set", "private"))
    from pydantic import BaseModel, ValidationError

    cls = _types.resolve(t["cls"], BaseModel, path=fmt_path(p))
    data = dict(_dec_pairs(t["fields"], p))
    if "extra" in t:
        data.update(_dec_pairs(t["extra"], p))
    try:
        obj = cls.model_validate(data)
    except ValidationError as exc:
        raise DecodeError(
            f"cannot decode stored value at {fmt_path(p)}: {t['cls']!r} no longer validates the stored fields: {exc}",
            path=fmt_path(p),
            type_name=t["cls"],
        ) from exc
    if "set" in t:
        object.__setattr__(obj, "__pydantic_fields_set__", set(t["set"]))
    if "private" in t:
        private = dict(_dec_pairs(t["private"], p))
        object.__setattr__(obj, "__pydantic_private__", {**(obj.__pydantic_private__ or {}), **private})
    return obj


def _d_dataclass(t, p):
    _need(t, p, "cls", "fields")
    cls = _types.resolve(t["cls"], object, path=fmt_path(p))
    if not dataclasses.is_dataclass(cls):
        raise _bad(p, f"{t['cls']!r} is not a dataclass")
    values = dict(_dec_pairs(t["fields"], p))
    names = {f.name for f in dataclasses.fields(cls)}
    if set(values) != names:
        raise DecodeError(
            f"cannot decode stored value at {fmt_path(p)}: dataclass {t['cls']!r} fields changed "
            f"(stored {sorted(values)}, now {sorted(names)})",
            path=fmt_path(p),
            type_name=t["cls"],
        )
    obj = cls.__new__(cls)
    for k, v in values.items():
        object.__setattr__(obj, k, v)
    return obj


def _d_namedtuple(t, p):
    _need(t, p, "cls", "items")
    cls = _types.resolve(t["cls"], tuple, path=fmt_path(p))
    if not (isinstance(getattr(cls, "_fields", None), tuple) and callable(getattr(cls, "_make", None))):
        raise UnknownTypeError(f"cannot load {t['cls']!r} at {fmt_path(p)}: a tuple subclass but not a namedtuple",
                               path=fmt_path(p), type_name=t["cls"])
    items = _d_items(t, p)
    if len(items) != len(cls._fields):
        raise _bad(p, f"namedtuple {t['cls']!r} has {len(cls._fields)} fields, stored {len(items)}")
    return cls(*items)


def _d_custom(t, p):
    _need(t, p, "name", "v")
    codec = _types.custom_codec_named(t["name"])
    if codec is None:
        from overnight.errors import UnknownTypeError

        raise UnknownTypeError(
            f"cannot load custom value {t['name']!r} at {fmt_path(p)}: no codec registered under that name",
            path=fmt_path(p),
            type_name=t["name"],
            hint="call overnight.register_codec(...) for that type before resuming",
        )
    return codec.decode(_dec(t["v"], p))


_DECODERS = {
    "str": _d_str,
    "int": _d_int,
    "float": _d_float,
    "dict": _d_dict,
    "tuple": _d_tuple,
    "set": _d_set,
    "frozenset": _d_frozenset,
    "bytes": _d_bytes,
    "bytearray": _d_bytearray,
    "datetime": _d_datetime,
    "date": _d_date,
    "time": _d_time,
    "timedelta": _d_timedelta,
    "decimal": _d_decimal,
    "uuid": _d_uuid,
    "complex": _d_complex,
    "fraction": _d_fraction,
    "path": _d_path,
    "OrderedDict": _d_ordereddict,
    "Counter": _d_counter,
    "defaultdict": _d_defaultdict,
    "deque": _d_deque,
    "enum": _d_enum,
    "model": _d_model,
    "dataclass": _d_dataclass,
    "namedtuple": _d_namedtuple,
    "custom": _d_custom,
}


# --- bytes -------------------------------------------------------------------------------------


# -- canonical bytes ---------------------------------------------------------------------------
#
# The reference encoder is the standard library's ``json.dumps(tree, ensure_ascii=True,
# separators=(",", ":"), allow_nan=False)``: its output *is* the format (docs/FORMAT.md). orjson
# writes the same bytes ~15x faster for the trees a commit usually writes, and is used where it
# provably does: :func:`_plain` admits only exact ``dict``/``list``/``str``/``int``/``float``/
# ``bool``/``None`` trees with str keys, no reference cycle, at most :data:`MAX_DEPTH` containers
# deep, whose floats are finite and print alike in both (they differ only for 0 < |x| < 1e-4:
# ``1e-05`` vs ``0.00001``); orjson itself refuses lone surrogates and ints beyond 64 bits; and
# its output must be ASCII without DEL (``ensure_ascii`` escapes every other code point, which the
# reference encoder does in C faster than Python could rewrite orjson's UTF-8). Everything else
# takes the reference encoder, which also raises for what JSON cannot hold. tests/test_codec.py
# checks the two byte for byte.

_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})


def _plain(tree: Any, depth: int = 0, ancestors: set[int] | None = None) -> bool:
    """Is ``tree`` one orjson encodes exactly as the reference encoder (see above)? Visits every node."""
    cls = type(tree)
    if cls is dict:
        items: Any = tree.values()
        for k in tree:
            if type(k) is not str:
                return False
    elif cls is list:
        items = tree
    elif cls is float:
        return math.isfinite(tree) and not 0.0 < abs(tree) < 1e-4
    else:
        return cls in _PLAIN_LEAVES
    if depth >= MAX_DEPTH:
        return False
    ancestors = ancestors if ancestors is not None else set()
    if id(tree) in ancestors:
        return False  # a cycle: the reference encoder raises for it
    ancestors.add(id(tree))
    for v in items:
        vc = type(v)
        if vc is str or vc is int or v is None or vc is bool:
            continue
        if not _plain(v, depth + 1, ancestors):
            return False
    ancestors.discard(id(tree))
    return True


def _fast_dumps(tree: Any, option: int) -> bytes | None:
    """The canonical bytes through orjson, or None when the reference encoder must write them."""
    if not _plain(tree):
        return None
    try:
        out = orjson.dumps(tree, option=option)
    except orjson.JSONEncodeError:  # lone surrogates, ints beyond 64 bits
        return None
    return out if out.isascii() and b"\x7f" not in out else None


def dumps(tree: Any) -> bytes:
    """Canonical bytes of a JSON tree (ASCII, compact, member order as given, no NaN/Infinity).

    Raises:
        ValueError: a non-finite float (``to_tree`` tags those; a raw tree must not hold one).
        TypeError: a value that is not part of a JSON tree.
    """
    out = _fast_dumps(tree, 0)
    if out is not None:
        return out
    return json.dumps(tree, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def dumps_sorted(tree: Any) -> bytes:
    """Canonical bytes with object keys sorted (records overnight writes itself); raises as :func:`dumps`."""
    out = _fast_dumps(tree, orjson.OPT_SORT_KEYS)
    if out is not None:
        return out
    return json.dumps(tree, ensure_ascii=True, separators=(",", ":"), allow_nan=False, sort_keys=True).encode("ascii")


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dupes = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
        raise DecodeError(f"duplicate JSON object keys {dupes}")
    return out


def _no_constant(name: str) -> Any:
    raise DecodeError(f"non-standard JSON constant {name} (canonical JSON has no NaN/Infinity)")


def loads(data: bytes | str) -> Any:
    """Parse canonical bytes into a JSON tree (strict: duplicate keys and NaN/Infinity are refused)."""
    try:
        return json.loads(data, object_pairs_hook=_no_dupes, parse_constant=_no_constant)
    except DecodeError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"not valid JSON: {exc}") from exc
    except RecursionError:
        raise DecodeError(f"not canonical JSON: nested too deeply (overnight writes at most {MAX_DEPTH} levels)") from None


_SMALL_FLOAT = re.compile(rb"[0-9][eE]-")


def _not_fast(data: bytes) -> bool:
    """Bytes where orjson's output could equal ``data`` and the reference encoder's not: floats
    0 < |x| < 1e-4 (orjson ``0.00001``, the reference ``1e-05``), DEL (the reference ``\\u007f``)."""
    return (b"0.0000" in data or b"\x7f" in data
            or ((b"e-" in data or b"E-" in data) and _SMALL_FLOAT.search(data) is not None))


def canonical_tree(data: bytes, *, sort_keys: bool = False) -> Any:
    """The tree ``data`` holds when ``data`` is byte for byte its canonical encoding
    (:func:`dumps`, or :func:`dumps_sorted` with ``sort_keys``), shown fast: orjson parses it and
    writes it back, and the two must be equal. None when that does not show it -- not canonical,
    not JSON, or bytes where orjson and the reference encoder may differ (non-ASCII, small floats,
    DEL, ints beyond 64 bits, duplicated members): the caller then takes the strict path
    (:func:`loads`, then the encoder), which gives the exact error. Never raises."""
    if not data.isascii() or _not_fast(data):
        return None
    try:
        tree = orjson.loads(data)
        out = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    return tree if out == data else None


def encode(value: Any, path: str = "value") -> bytes:
    """``value -> canonical bytes`` (``dumps(to_tree(value))``). Raises :class:`EncodeError`."""
    return dumps(to_tree(value, path))


def decode(data: bytes | str, path: str = "value") -> Any:
    """``canonical bytes -> value`` (``from_tree(loads(data))``). Raises :class:`DecodeError`."""
    return from_tree(loads(data), path)
