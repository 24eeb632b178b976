"""The canonical codec: exact round trips, determinism, write-time refusals, strict loading.

What a user relies on: whatever they put in state or return from a step comes back as the *same*
value of the *same* type (recursively), the bytes are deterministic, a value that cannot be
stored is refused when it is written (naming where it is and what it is), and a stored tree that
cannot be decoded exactly fails loudly instead of loading something else.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import fractions
import json
import math
import os
import struct
import pathlib
import subprocess
import sys
import textwrap
import uuid
import zoneinfo
from pathlib import Path
from typing import Any, NamedTuple

import pydantic
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import overnight
from overnight.codec import canonical, decode, encode, from_tree, to_tree
from overnight.errors import DecodeError, EncodeError, UnknownTypeError

STRINGS_JSON = Path("/work/shared/cases/strings.json")
HANDED_STRINGS: list[str] = json.loads(STRINGS_JSON.read_text(encoding="utf-8"))

# huge ints make hypothesis warn about the size of its example reprs; that is expected here
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- type-exact comparison ---------------------------------------------------------------------


def _same_tz(a: dt.tzinfo | None, b: dt.tzinfo | None, where: str, ref: Any) -> None:
    assert type(a) is type(b), f"{where}: tzinfo type {type(a)} != {type(b)}"
    if isinstance(a, zoneinfo.ZoneInfo):
        assert a.key == b.key, f"{where}: zone {a.key!r} != {b.key!r}"
    elif isinstance(a, dt.timezone):
        assert a.utcoffset(None) == b.utcoffset(None), f"{where}: offset {a!r} != {b!r}"
        assert a.tzname(None) == b.tzname(None), f"{where}: tzname {a.tzname(None)!r} != {b.tzname(None)!r}"


def assert_same(a: Any, b: Any, where: str = "value") -> None:
    """``a`` and ``b`` are the same value with the same types all the way down (NaN == NaN)."""
    assert type(a) is type(b), f"{where}: type {type(a).__name__} != {type(b).__name__} ({a!r} vs {b!r})"
    if isinstance(a, float):
        if math.isnan(a):  # the same NaN, bit for bit (sign and payload too)
            assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} != {b!r}"
        else:
            assert a == b and math.copysign(1, a) == math.copysign(1, b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, complex):
        assert_same(a.real, b.real, where + ".real")
        assert_same(a.imag, b.imag, where + ".imag")
    elif isinstance(a, decimal.Decimal):
        # str() is exact: sign, digits, exponent, NaN/sNaN/Infinity (and == raises on sNaN)
        assert str(a) == str(b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, str):
        assert a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (dt.datetime, dt.time)):
        assert a.isoformat() == b.isoformat(), f"{where}: {a.isoformat()} != {b.isoformat()}"
        assert a.fold == b.fold, f"{where}: fold {a.fold} != {b.fold}"
        _same_tz(a.tzinfo, b.tzinfo, where, a)
        assert a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, collections.defaultdict):
        assert a.default_factory is b.default_factory, f"{where}: default_factory {a.default_factory} != {b.default_factory}"
        _same_mapping(a, b, where)
    elif isinstance(a, dict):
        _same_mapping(a, b, where)
    elif isinstance(a, collections.deque):
        assert a.maxlen == b.maxlen, f"{where}: maxlen {a.maxlen} != {b.maxlen}"
        _same_seq(a, b, where)
    elif isinstance(a, (list, tuple)):
        if hasattr(type(a), "_fields"):
            assert a._fields == b._fields
        _same_seq(a, b, where)
    elif isinstance(a, (set, frozenset)):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)} items"
        # pair the elements up by their canonical form, then compare type-exactly
        for i, (x, y) in enumerate(zip(sorted(a, key=encode), sorted(b, key=encode))):
            assert_same(x, y, f"{where}{{{i}}}")
    elif isinstance(a, pydantic.BaseModel):
        for name in type(a).model_fields:
            assert_same(getattr(a, name), getattr(b, name), f"{where}.{name}")
        assert a.model_fields_set == b.model_fields_set, f"{where}: fields_set differs"
        assert a == b
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, enum.Enum):
        assert a is b, f"{where}: {a!r} is not {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _same_mapping(a: Any, b: Any, where: str) -> None:
    assert len(a) == len(b), f"{where}: {len(a)} keys != {len(b)} keys"
    for i, ((ka, va), (kb, vb)) in enumerate(zip(a.items(), b.items())):
        assert_same(ka, kb, f"{where}<key {i}>")
        assert_same(va, vb, f"{where}[{ka!r}]")


def _same_seq(a: Any, b: Any, where: str) -> None:
    assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        assert_same(x, y, f"{where}[{i}]")


def roundtrip(value: Any) -> Any:
    data = encode(value)
    assert isinstance(data, bytes)
    assert data.isascii(), f"encoding is not ASCII: {data[:200]!r}"
    back = decode(data)
    assert_same(value, back)
    return back


def test_assert_same_can_fail() -> None:
    """The comparator itself must tell types and special values apart, or every property is void."""
    for a, b in [
        ((1, 2), [1, 2]),
        (1, True),
        (1, 1.0),
        (0.0, -0.0),
        (decimal.Decimal("1.0"), decimal.Decimal("1.00")),
        (collections.OrderedDict(a=1), {"a": 1}),
        (collections.deque([1], maxlen=2), collections.deque([1])),
        (collections.defaultdict(list), collections.defaultdict(set)),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2020, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))),
        (dt.datetime(2020, 1, 1, tzinfo=zoneinfo.ZoneInfo("UTC")), dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)),
        (bytearray(b"x"), b"x"),
        ({1}, frozenset({1})),
        ("\ud83d\ude00", "\U0001f600"),
    ]:
        with pytest.raises(AssertionError):
            assert_same(a, b)


# --- strategies --------------------------------------------------------------------------------

# every code point, surrogates (category Cs) included; the second form makes adjacent surrogate
# *pairs* (which JSON would merge into one astral character) and the other hard cases frequent
full_text = st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF))
hard_chars = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, codec=None) | st.sampled_from(
    ["\x00", "\u2028", "\u2029", "\ufeff", "\U0001f9ea", "\u4e2d", "\\", '"', "$", "t", "a", "\x1b", "\x7f"]
)
hard_text = st.text(alphabet=hard_chars)
texts = full_text | hard_text

big_ints = st.integers(min_value=10**3990, max_value=10**4010) | st.integers(min_value=-(10**4010), max_value=-(10**3990))
ints = st.integers() | big_ints | st.sampled_from([10**4000 - 1, 10**4000, -(10**4000) + 1, -(10**4000), 2**63, -(2**63) - 1])
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308])

fixed_offsets = st.builds(
    dt.timezone, st.integers(min_value=-(24 * 3600 - 1), max_value=24 * 3600 - 1).map(lambda s: dt.timedelta(seconds=s))
)
named_offsets = st.builds(
    dt.timezone,
    st.integers(min_value=-23 * 60, max_value=23 * 60).map(lambda m: dt.timedelta(minutes=m)),
    st.text(alphabet=st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=8),
)
zones = st.sampled_from(sorted(zoneinfo.available_timezones())).map(zoneinfo.ZoneInfo) if zoneinfo.available_timezones() else st.nothing()
tzinfos = st.none() | st.just(dt.timezone.utc) | fixed_offsets | named_offsets | zones
datetimes = st.datetimes(timezones=tzinfos, allow_imaginary=True) | st.datetimes(timezones=zones, allow_imaginary=False)
times = st.times(timezones=st.none() | st.just(dt.timezone.utc) | fixed_offsets | named_offsets)
decimals = st.decimals(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [decimal.Decimal(s) for s in ("-0", "0E-7", "1E+3", "-1.2300E-10", "NaN", "-NaN", "sNaN", "Infinity", "-Infinity",
                                  "123456789012345678901234567890.000000000001")]
)
hashable_decimals = decimals.filter(lambda d: not d.is_snan())  # a signalling NaN cannot be hashed

hashable_leaves = (
    st.none() | st.booleans() | ints | floats | texts | st.binary(max_size=16) | st.dates() | st.uuids()
    | hashable_decimals | st.timedeltas()
)
hashables = st.recursive(
    hashable_leaves, lambda c: st.tuples(c, c) | st.frozensets(c, max_size=3) | st.tuples(), max_leaves=8
)
leaves = (
    hashable_leaves | decimals | datetimes | times | st.binary(max_size=16).map(bytearray)
)
values = st.recursive(
    leaves,
    lambda c: (
        st.lists(c, max_size=4)
        | st.lists(c, max_size=4).map(tuple)
        | st.dictionaries(texts, c, max_size=4)
        | st.dictionaries(hashables, c, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=20,
)


# --- property round trips ----------------------------------------------------------------------


@SETTINGS
@given(texts)
@example("\ud800")
@example("\ud83d\ude00")  # a surrogate *pair* held as two code points
@example("\U0001f600")
@example("\ud800\ud83d\ude00\udfff")
@example("\x00\u2028\u2029")
def test_text_roundtrips(s: str) -> None:
    back = roundtrip(s)
    assert len(back) == len(s)
    assert [ord(c) for c in back] == [ord(c) for c in s]


@SETTINGS
@given(texts, texts)
@example("$t", "x")
@example("\ud83d\ude00", "\ud800")
def test_text_as_dict_key_and_in_lists(k: str, v: str) -> None:
    roundtrip({k: v})
    roundtrip({k: [v, k], "other": {v: k}})
    roundtrip([k, [v], (k, v)])


@SETTINGS
@given(ints)
def test_ints_roundtrip(n: int) -> None:
    roundtrip(n)
    roundtrip([n, {"n": n}, {n: n}])


@SETTINGS
@given(floats)
def test_floats_roundtrip(x: float) -> None:
    roundtrip(x)
    roundtrip({"x": [x, (x,)]})


@SETTINGS
@given(st.binary() | st.binary().map(bytearray))
def test_bytes_roundtrip(b: bytes | bytearray) -> None:
    roundtrip(b)
    roundtrip({"b": [b]})


@SETTINGS
@given(datetimes)
@example(dt.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("America/New_York")))  # ambiguous, 2nd
@example(dt.datetime(2021, 11, 7, 1, 30, fold=0, tzinfo=zoneinfo.ZoneInfo("America/New_York")))  # ambiguous, 1st
@example(dt.datetime(2021, 3, 14, 2, 30, tzinfo=zoneinfo.ZoneInfo("America/New_York")))  # in the gap
@example(dt.datetime(2021, 1, 1, fold=1))
@example(dt.datetime(1, 1, 1))
@example(dt.datetime.max)
@example(dt.datetime(2020, 5, 5, 12, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")))
@example(dt.datetime(2020, 5, 5, 12, tzinfo=dt.timezone(dt.timedelta(0))))
def test_datetimes_roundtrip(v: dt.datetime) -> None:
    roundtrip(v)
    roundtrip({"when": v, "list": [v]})


@SETTINGS
@given(times, st.dates(), st.timedeltas())
@example(dt.time(1, 2, 3, 4, fold=1), dt.date.min, dt.timedelta.min)
@example(dt.time(23, 59, 59, 999999, tzinfo=dt.timezone.utc), dt.date.max, dt.timedelta.max)
def test_time_date_timedelta_roundtrip(t: dt.time, d: dt.date, td: dt.timedelta) -> None:
    roundtrip(t)
    roundtrip(d)
    roundtrip(td)
    roundtrip([t, d, td])


def test_time_with_zoneinfo_roundtrips() -> None:
    roundtrip(dt.time(1, 2, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")))


@SETTINGS
@given(decimals)
def test_decimals_roundtrip(d: decimal.Decimal) -> None:
    roundtrip(d)
    roundtrip({"d": [d]})


@SETTINGS
@given(st.uuids())
def test_uuids_roundtrip(u: uuid.UUID) -> None:
    roundtrip(u)
    roundtrip({u: [u]})


@SETTINGS
@given(values)
def test_nested_values_roundtrip(v: Any) -> None:
    roundtrip(v)
    roundtrip({"state": v, "again": [v]})


@SETTINGS
@given(values)
def test_reencoding_is_stable(v: Any) -> None:
    """Decoding and encoding again gives the very same bytes (what digests and dedup rely on)."""
    data = encode(v)
    assert encode(decode(data)) == data


# --- module-level types (resolvable on load) ---------------------------------------------------


class Color(enum.Enum):
    RED = 1
    GREEN = "green"


class Flags(enum.IntFlag):
    A = 1
    B = 2


class Item(pydantic.BaseModel):
    class Kind(enum.Enum):
        BOOK = "book"
        PEN = "pen"

    name: str
    kind: Kind
    when: dt.datetime | None = None
    tags: set[str] = set()


@dataclasses.dataclass
class Point:
    x: int
    y: Any = None


class Pair(NamedTuple):
    a: Any
    b: Any


def test_library_types_roundtrip() -> None:
    model = Item(name="n\x00\ud800", kind=Item.Kind.PEN, when=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
                 tags={"a", "b"})
    roundtrip(model)
    roundtrip(Item(name="only required", kind=Item.Kind.BOOK))  # model_fields_set kept
    roundtrip(Color.RED)
    roundtrip(Color.GREEN)
    roundtrip(Flags.A | Flags.B)
    roundtrip(Point(1, {"k": (1, 2)}))
    roundtrip(Pair(1, [2]))
    roundtrip({"m": [model], "p": Point(2, Color.RED)})
    roundtrip(complex(1.5, -0.0))
    roundtrip(fractions.Fraction(-3, 7))
    roundtrip(pathlib.PurePosixPath("/a/b"))
    roundtrip(pathlib.PureWindowsPath(r"C:\x\y"))
    roundtrip(collections.OrderedDict([("b", 1), ("a", 2)]))
    roundtrip(collections.Counter("abca"))
    roundtrip(collections.defaultdict(list, {"a": [1]}))
    roundtrip(collections.defaultdict(None, {1: 2}))
    roundtrip(collections.deque([1, 2], maxlen=3))
    roundtrip(collections.deque())
    roundtrip({"$t": "not a tag", "x": 1})


def test_defaultdict_still_defaults_after_roundtrip() -> None:
    back = roundtrip(collections.defaultdict(list, {"a": [1]}))
    back["new"].append(1)
    assert back["new"] == [1]


# --- handed strings ----------------------------------------------------------------------------


@pytest.mark.parametrize("s", HANDED_STRINGS, ids=[f"s{i}" for i in range(len(HANDED_STRINGS))])
def test_handed_strings_roundtrip(s: str) -> None:
    for value in (s, {s: s}, [s, [s]], {"k": {s: [s, (s,)]}}, {s: 1, "plain": 2}, {(s, 1): s}):
        back = roundtrip(value)
        assert_same(value, back)
    assert encode(s).isascii()
    assert encode({s: [s]}).isascii()


def test_handed_strings_all_together() -> None:
    roundtrip(HANDED_STRINGS)
    roundtrip({s: i for i, s in enumerate(HANDED_STRINGS)})


def test_lone_surrogate_is_a_plain_json_string() -> None:
    assert to_tree("\ud800") == "\ud800"
    assert encode("\ud800") == b'"\\ud800"'
    assert to_tree("a\u2028b\u2029c") == "a\u2028b\u2029c"
    assert to_tree("before\x00after") == "before\x00after"


# --- canonical determinism ---------------------------------------------------------------------


@SETTINGS
@given(values)
def test_equal_values_same_insertion_order_same_bytes(v: Any) -> None:
    import copy

    assert encode(copy.deepcopy(v)) == encode(v)


@SETTINGS
@given(st.lists(hashables, max_size=8, unique=True), st.randoms(use_true_random=False))
def test_sets_encode_regardless_of_construction_order(items: list, rnd: Any) -> None:
    # unique by ==, so no element is dropped in favour of an equal one of another type
    # (1 == 1.0 == True, Decimal("-Infinity") == -inf): that would make genuinely different sets
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert encode(set(items)) == encode(set(shuffled))
    assert encode(frozenset(items)) == encode(frozenset(reversed(items)))
    assert encode({"s": set(items)}) == encode({"s": set(reversed(shuffled))})


def test_sets_encode_identically_across_hash_seeds(tmp_path: Path) -> None:
    """String hashing is randomised per process: set bytes must not depend on it."""
    script = tmp_path / "enc.py"
    script.write_text(textwrap.dedent("""
        import sys
        from overnight.codec import encode
        words = ["alpha", "beta", "gamma", "delta", "\\u4e2d", "x\\ud800", "", "zeta", "eta", "theta"]
        value = {"s": set(words), "f": frozenset(words), "n": {frozenset({"a", "b"}), frozenset({"c"})}}
        sys.stdout.write(encode(value).decode("ascii"))
    """))
    outs = set()
    for seed in ("1", "2", "3", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1


def test_dict_order_is_kept() -> None:
    a = {"b": 1, "a": 2}
    b = {"a": 2, "b": 1}
    assert encode(a) == encode(dict(a))
    assert list(decode(encode(a))) == ["b", "a"]
    assert list(decode(encode(b))) == ["a", "b"]


# --- write-time refusals -----------------------------------------------------------------------


class Opaque:
    pass


def _gen():
    yield 1


def _refused(value: Any, *, type_part: str) -> EncodeError:
    """Put ``value`` at ``state.data.items[3].when`` and check the refusal names path and type."""
    data = {"items": [0, 1, 2, {"when": value}]}
    with pytest.raises(EncodeError) as info:
        to_tree(data, "state.data")
    err = info.value
    assert "state.data.items[3].when" in str(err)
    assert type_part in str(err)
    assert err.path == "state.data.items[3].when"
    return err


def test_refuses_plain_object() -> None:
    err = _refused(Opaque(), type_part="Opaque")
    assert "Opaque" in err.type_name


def test_refuses_lambda() -> None:
    _refused(lambda: 1, type_part="function")


def test_refuses_open_file(tmp_path: Path) -> None:
    with open(tmp_path / "f.txt", "w") as fh:
        _refused(fh, type_part="TextIOWrapper")


def test_refuses_generator() -> None:
    _refused(_gen(), type_part="generator")


def test_refuses_subclass_of_dict_and_str() -> None:
    class MyDict(dict):
        pass

    class MyStr(str):
        pass

    _refused(MyDict(a=1), type_part="MyDict")
    _refused(MyStr("x"), type_part="MyStr")


def test_refuses_classes_defined_in_a_function() -> None:
    class LocalEnum(enum.Enum):
        A = 1

    class LocalModel(pydantic.BaseModel):
        a: int = 1

    @dataclasses.dataclass
    class LocalData:
        a: int = 1

    for value, name in ((LocalEnum.A, "LocalEnum"), (LocalModel(), "LocalModel"), (LocalData(), "LocalData")):
        err = _refused(value, type_part=name)
        assert name in err.type_name


def test_refuses_unsupported_value_nested_in_a_model() -> None:
    class Holder(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        thing: Any = None

    overnight.register_type(Holder)  # the model itself is resolvable; its field value is not storable
    with pytest.raises(EncodeError) as info:
        to_tree({"h": Holder(thing=Opaque())}, "state.data")
    assert "state.data.h.thing" in str(info.value)
    assert "Opaque" in str(info.value)


def test_refuses_reference_cycle_in_list() -> None:
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(EncodeError) as info:
        to_tree({"items": [0, loop]}, "state.data")
    msg = str(info.value)
    assert "cycle" in msg
    assert "state.data.items[1]" in msg


def test_refuses_reference_cycle_in_dict() -> None:
    d: dict = {"a": 1}
    d["self"] = {"again": d}
    with pytest.raises(EncodeError) as info:
        to_tree({"data": d}, "state")
    msg = str(info.value)
    assert "cycle" in msg
    assert "state.data" in msg


def test_refuses_reference_cycle_through_dataclass() -> None:
    """A cycle that passes through a dataclass must be named like any other cycle (not 'nested too deeply' at the root)."""
    node = Point(1)
    d = {"node": node}
    node.y = d
    with pytest.raises(EncodeError) as info:
        to_tree({"graph": d}, "state.data")
    msg = str(info.value)
    assert "cycle" in msg, msg
    assert "state.data.graph" in msg, msg


def _nested(levels: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for i in range(levels):
        value = [value] if i % 3 == 1 else ({"k": value} if i % 3 == 2 else (value, i))
    return value


def test_every_value_that_encodes_decodes_up_to_the_depth_limit() -> None:
    """Decoding takes more stack per level than encoding: the write-time limit keeps every stored
    value loadable, even from a deep call stack."""
    from overnight.codec.canonical import MAX_DEPTH

    deepest = _nested(MAX_DEPTH)
    data = encode(deepest)

    def at_depth(frames: int) -> Any:  # decode from under a deep caller stack
        return decode(data) if frames == 0 else at_depth(frames - 1)

    assert at_depth(150) == deepest


def test_refuses_a_value_nested_past_the_limit_naming_where() -> None:
    from overnight.codec.canonical import MAX_DEPTH

    with pytest.raises(EncodeError) as info:
        to_tree({"tree": _nested(MAX_DEPTH + 5)}, "state.data")
    msg = str(info.value)
    assert f"more than {MAX_DEPTH}" in msg and msg.startswith("cannot store the value at state.data.tree")
    assert info.value.hint and "artifact" in info.value.hint


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000])
def test_deeply_nested_stored_json_is_a_decode_error_not_a_crash(raw: bytes) -> None:
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode(raw)


def test_refuses_defaultdict_with_lambda_factory() -> None:
    with pytest.raises(EncodeError) as info:
        to_tree({"counts": collections.defaultdict(lambda: 0)}, "state.data")
    msg = str(info.value)
    assert "state.data.counts" in msg
    assert "defaultdict" in msg
    assert "default_factory" in msg


def test_refused_value_fails_the_step_and_commits_nothing(tmp_path: Path) -> None:
    """Through a real run: the EncodeError names the path; the head stays at the last good checkpoint."""
    from overnight.store import open_store

    url = f"sqlite://{tmp_path / 'o.db'}"
    task = overnight.Task("refuse-at-write", goal="g", expected_span="1h")

    @task.step
    def good(ctx):
        ctx.state["items"] = [0, 1, 2, {"when": "fine"}]

    @task.step
    def bad(ctx):
        ctx.state["items"][3]["when"] = Opaque()

    with pytest.raises(EncodeError) as info:
        overnight.run(task, url, handle_signals=False)
    assert "state.data.items[3].when" in str(info.value)
    assert "Opaque" in str(info.value)
    store = open_store(url)
    try:
        head = store.get_ref("refuse-at-write", "main")
        assert store.get_checkpoint(head).step == "good"
    finally:
        store.close()


# --- decode failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b'{"$t":"no-such-tag","v":1}',
        b'[1,{"$t":"no-such-tag"}]',
        b'{"$t":5,"v":1}',
        b'{"$t":"bytes"}',  # missing member
        b'{"$t":"bytes","b64":"","extra":1}',  # extra member
        b'{"$t":"tuple"}',
        b'{"$t":"tuple","items":[],"more":[]}',
        b'{"$t":"datetime","v":"2020-01-01T00:00:00","zonee":"UTC"}',
        b'{"$t":"decimal"}',
        b'{"$t":"deque","items":[1]}',
        b'{"$t":"dict","items":[[1]]}',
        b'{"$t":"dict","items":{"a":1}}',
        b'{"$t":"bytes","b64":"!!not base64!!"}',
        b'{"$t":"datetime","v":"not a date"}',
        b'{"$t":"float","v":"1.5"}',
        b'{"$t":"int","hex":5}',
        b'{"$t":"uuid","v":"xyz"}',
        b'{"$t":"str","b64":"/w=="}',  # not UTF-8
        b'{"$t":"defaultdict","factory":"os.system","items":[]}',
        b'{"$t":"complex","re":1}',
    ],
)
def test_tampered_trees_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


@pytest.mark.parametrize(
    "data",
    [b'{"a":1,"a":2}', b'[{"x":{"k":1,"k":1}}]', b'{"$t":"bytes","b64":"","b64":"YQ=="}'],
)
def test_duplicate_json_keys_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode(data)
    assert "duplicate" in str(info.value)


@pytest.mark.parametrize("data", [b"NaN", b"[NaN]", b'{"x":Infinity}', b"[-Infinity]"])
def test_nan_literals_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


@pytest.mark.parametrize("data", [b"{", b"", b'"\xff"', b"[1,]"])
def test_invalid_json_raises_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


@pytest.mark.parametrize("bits", [0xFFF8000000000000, 0x7FF8000000000123, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF])
def test_a_nan_keeps_its_sign_and_payload(bits: int) -> None:
    """Attacker: ``-float('nan')`` was stored and came back as ``float('nan')``: its sign bit (what
    ``inf - inf`` gives on x86) and any payload were lost without a word. Now every NaN comes back
    bit for bit; ``float('nan')`` itself is stored as before (no ``bits``)."""
    x = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
    assert math.isnan(x)
    for value in (x, {"m": [1.0, x]}, complex(0, x), (x,)):
        assert_same(decode(encode(value)), value)
    assert encode(x) == b'{"$t":"float","v":"nan","bits":"%016x"}' % bits
    assert encode(math.nan) == b'{"$t":"float","v":"nan"}'
    assert_same(decode(encode(math.inf - math.inf)), math.inf - math.inf)


@pytest.mark.parametrize("bits", ['"7ff8000000000000"', '"3ff0000000000000"', '"FFF8000000000000"', '"fff8"', "1"])
def test_float_bits_that_are_not_another_nan_fail_the_load(bits: str) -> None:
    """``bits`` names a NaN other than float('nan') in 16 lowercase hex digits, else the load fails."""
    with pytest.raises(DecodeError):
        decode(b'{"$t":"float","v":"nan","bits":%s}' % bits.encode())
    with pytest.raises(DecodeError):
        decode(b'{"$t":"float","v":"inf","bits":"fff8000000000000"}')


def test_encoder_never_writes_nan_literals() -> None:
    for v in (math.nan, [math.inf], {"x": -math.inf}):
        data = encode(v)
        assert b"NaN" not in data and b"Infinity" not in data
        json.loads(data, parse_constant=lambda c: pytest.fail(f"non-standard constant {c}"))


@pytest.mark.parametrize(
    "tag,extra",
    [
        ("enum", {"v": 1}),
        ("model", {"fields": []}),
        ("dataclass", {"fields": []}),
        ("namedtuple", {"items": []}),
    ],
)
def test_unknown_class_ref_raises_unknown_type_error(tag: str, extra: dict) -> None:
    ref = "overnight_test_gone_module:Vanished.Inner"
    tree = {"state": [{"$t": tag, "cls": ref, **extra}]}
    with pytest.raises(UnknownTypeError) as info:
        from_tree(tree, "state.data")
    assert ref in str(info.value)
    assert info.value.type_name == ref
    assert "state.data" in str(info.value)


def test_unknown_custom_codec_name_raises_unknown_type_error() -> None:
    with pytest.raises(UnknownTypeError) as info:
        decode(b'{"$t":"custom","name":"overnight.tests:NoSuchCodec","v":1}')
    assert "overnight.tests:NoSuchCodec" in str(info.value)


def test_ref_to_wrong_kind_is_unknown_type() -> None:
    # the module is imported and has that name, but it is not an Enum
    with pytest.raises(UnknownTypeError):
        from_tree({"$t": "enum", "cls": "os:path", "v": 1})
    with pytest.raises(DecodeError):  # resolvable, but not a dataclass: still a loud failure
        from_tree({"$t": "dataclass", "cls": "builtins:dict", "fields": []})


def test_loading_never_imports_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported.marker"
    (tmp_path / "overnight_sidefx_mod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport enum\nclass Color(enum.Enum):\n    RED = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownTypeError):
        from_tree({"$t": "enum", "cls": "overnight_sidefx_mod:Color", "v": 1})
    assert not marker.exists()
    assert "overnight_sidefx_mod" not in sys.modules


def test_a_task_file_loaded_again_in_one_process_keeps_its_module_name(tmp_path: Path) -> None:
    """A worker's session runs task after task: the second load of the same file must be the same
    module, so its classes keep the name the first task's checkpoints recorded them under."""
    from overnight.runtime.task_code import load_task

    (tmp_path / "overnight_twice_mod.py").write_text(textwrap.dedent("""
        import enum
        import overnight
        class Shade(enum.Enum):
            DARK = 1
        task = overnight.Task("twice", goal="g")
    """))
    try:
        first = load_task(str(tmp_path / "overnight_twice_mod.py"))
        again = load_task(str(tmp_path / "overnight_twice_mod.py"))
        assert again is first
        shade = sys.modules["overnight_twice_mod"].Shade
        assert to_tree(shade.DARK)["cls"] == "overnight_twice_mod:Shade"
        assert "overnight_task_overnight_twice_mod" not in sys.modules
    finally:
        sys.modules.pop("overnight_twice_mod", None)
        sys.modules.pop("overnight_task_overnight_twice_mod", None)


def test_forget_modules_drops_their_registrations() -> None:
    """A worker's session drops a task's modules after the task: their registered classes must not
    answer for the next task's classes of the same name."""
    from overnight.codec.registry import custom_codec_for, forget_modules, resolve

    Gone = type("Gone", (), {"__module__": "overnight_gone_mod"})
    overnight.register_type(Gone, "overnight_gone_mod:Alias")
    overnight.register_codec(Gone, lambda g: 1, lambda v: Gone())
    assert resolve("overnight_gone_mod:Alias", object, path="x") is Gone and custom_codec_for(Gone) is not None
    forget_modules({"overnight_gone_mod"})
    with pytest.raises(UnknownTypeError):
        resolve("overnight_gone_mod:Alias", object, path="x")
    assert custom_codec_for(Gone) is None
    with pytest.raises(EncodeError):
        to_tree(Gone())


def test_unknown_enum_value_raises_decode_error() -> None:
    with pytest.raises(DecodeError) as info:
        from_tree({"$t": "enum", "cls": f"{Color.__module__}:Color", "v": 99})
    assert "Color" in str(info.value)


class Renamed(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass
class RenamedData:
    a: int


def test_register_type_alias_makes_old_ref_loadable() -> None:
    old = "overnight_test_old.module:OldName"
    tree = {"$t": "enum", "cls": old, "v": 2}
    with pytest.raises(UnknownTypeError):
        from_tree(tree)
    overnight.register_type(Renamed, old)
    assert from_tree(tree) is Renamed.BLUE
    assert decode(json.dumps(tree)) is Renamed.BLUE

    old_dc = "overnight_test_old.module:OldData"
    dc_tree = {"$t": "dataclass", "cls": old_dc, "fields": [["a", 5]]}
    with pytest.raises(UnknownTypeError):
        from_tree(dc_tree)
    overnight.register_type(RenamedData, old_dc)
    assert_same(from_tree(dc_tree), RenamedData(5))


def test_register_type_makes_local_class_storable() -> None:
    def make():
        class Local(enum.Enum):
            X = "x"

        return Local

    Local = make()
    with pytest.raises(EncodeError):
        encode(Local.X)
    overnight.register_type(Local)
    assert decode(encode({"v": Local.X})) == {"v": Local.X}


# --- register_codec ----------------------------------------------------------------------------


class Money:
    def __init__(self, amount: decimal.Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return type(other) is Money and (self.amount, self.currency) == (other.amount, other.currency)

    def __hash__(self) -> int:
        return hash((self.amount, self.currency))


def test_register_codec_roundtrip() -> None:
    with pytest.raises(EncodeError):
        encode(Money(decimal.Decimal("1.50"), "EUR"))
    overnight.register_codec(
        Money,
        lambda m: {"amount": m.amount, "currency": m.currency},
        lambda v: Money(v["amount"], v["currency"]),
        name="overnight-tests.money",
    )
    value = {"price": Money(decimal.Decimal("1.50"), "EUR\x00\ud800"), "list": [Money(decimal.Decimal("-0"), "USD")],
             "set": {Money(decimal.Decimal("2"), "GBP")}}
    back = roundtrip(value)
    assert type(back["price"]) is Money
    assert str(back["price"].amount) == "1.50"
    assert back["price"].currency == "EUR\x00\ud800"
    assert b"overnight-tests.money" in encode(value)


# --- the fast encoder writes the reference encoder's bytes -------------------------------------
#
# Canonical bytes are what digests and checkpoint ids are computed over, and loading refuses a
# record whose bytes are not canonical: the orjson path (overnight.codec.canonical._fast_dumps)
# must write exactly what json.dumps(ensure_ascii=True, separators=(",", ":"), allow_nan=False)
# writes, for every tree, or decline.

from overnight.codec.canonical import _fast_dumps, dumps, dumps_sorted  # noqa: E402

import orjson  # noqa: E402


def _reference(tree: Any, sort: bool = False) -> bytes:
    return json.dumps(tree, ensure_ascii=True, separators=(",", ":"), allow_nan=False, sort_keys=sort).encode("ascii")


json_leaves = st.none() | st.booleans() | ints | floats.filter(math.isfinite) | texts
json_trees = st.recursive(
    json_leaves, lambda c: st.lists(c, max_size=5) | st.dictionaries(texts, c, max_size=5), max_leaves=30
)


@SETTINGS
@given(json_trees)
@example({"b": 1, "a": ["\x7f", "\u2028", "\U0001f9ea", "\x00\x1f", 1e-05, 1e16, -0.0, 2**63, 2**64]})
def test_fast_encoder_writes_the_reference_bytes(tree: Any) -> None:
    assert dumps(tree) == _reference(tree)
    assert dumps_sorted(tree) == _reference(tree, sort=True)


ascii_text = st.text(alphabet=st.characters(codec="ascii", exclude_characters="\x7f"))


@SETTINGS
@given(st.lists(ascii_text, max_size=6), st.lists(ascii_text | st.floats(allow_nan=False, allow_infinity=False)
                                                  | st.integers(-(2**63), 2**63 - 1), max_size=6))
def test_fast_encoder_takes_plain_trees(keys: list[str], xs: list[Any]) -> None:
    """What a commit usually writes (ASCII text, str keys, 64-bit ints, finite floats outside
    (0, 1e-4)) takes the fast path, with the reference bytes."""
    tree = {k: [x for x in xs if not (type(x) is float and 0 < abs(x) < 1e-4)] for k in keys}
    assert _fast_dumps(tree, 0) == _reference(tree)
    assert _fast_dumps(tree, orjson.OPT_SORT_KEYS) == _reference(tree, sort=True)


def test_fast_encoder_agrees_on_floats_of_every_magnitude() -> None:
    import random
    import struct

    rng = random.Random(7)
    xs = [0.0, -0.0, 1e-4, 9.999999999999999e-05, 1e-05, 1e-10, 1e15, 1e16, 1e17, 1e21, 1e22, 5e-324,
          1.7976931348623157e308, 0.1, 1.0, 100.0, 123456789.125]
    xs += [rng.uniform(1, 10) * 10.0**e * rng.choice((1, -1)) for e in range(-320, 308) for _ in range(20)]
    xs += [x for x in struct.unpack("20000d", rng.randbytes(8 * 20_000)) if math.isfinite(x)]
    assert dumps(xs) == _reference(xs)
    taken = [x for x in xs if _fast_dumps([x], 0) is not None]
    assert len(taken) == sum(1 for x in xs if not 0 < abs(x) < 1e-4)  # declines only the small ones
    assert all(_fast_dumps([x], 0) == _reference([x]) for x in taken)


@pytest.mark.parametrize("tree", [
    [math.nan], {"x": math.inf}, [-math.inf],  # orjson would write null: the reference raises
    ("tuple",), {1: "int key"}, [b"bytes"], [dt.date(2026, 1, 1)], [uuid.UUID(int=1)],  # not JSON trees
    ["\ud800 lone surrogate"], [2**64 + 1], [10**30],  # orjson refuses these
    [1e-05], [-3.5e-07],  # formatted differently by orjson
    ["caf\u00e9"], {"\u4e2d": 1}, ["\x7f"], ["\U0001f9ea"],  # escaped by the reference, in C
    __import__("functools").reduce(lambda inner, _: [inner], range(120), []),  # deeper than MAX_DEPTH
])
def test_fast_encoder_declines_what_it_cannot_write_exactly(tree: Any) -> None:
    assert _fast_dumps(tree, 0) is None
    try:
        expected: bytes | type[Exception] = _reference(tree)
    except (TypeError, ValueError) as exc:
        expected = type(exc)
    if isinstance(expected, bytes):
        assert dumps(tree) == expected
    else:
        with pytest.raises(expected):
            dumps(tree)


def test_fast_encoder_declines_a_reference_cycle() -> None:
    for tree in ([1], [0] * 10_000, {"a": [1.5, "x"]}):
        (tree["a"] if isinstance(tree, dict) else tree).append(tree)  # type: ignore[union-attr]
        assert _fast_dumps(tree, 0) is None
        with pytest.raises(ValueError, match="Circular"):
            dumps(tree)
    shared = ["not a cycle"]
    assert dumps([shared, shared, {"k": shared}]) == _reference([shared, shared, {"k": shared}])


def test_orjson_itself_differs_where_the_fast_path_declines() -> None:
    """Guards the reason for the float rule: if orjson ever prints these like repr(), the rule can go."""
    assert orjson.dumps(1e-05) != json.dumps(1e-05).encode()


# -- the fast canonical check (orjson both ways) ------------------------------------------------


@pytest.mark.parametrize("data", [
    b'{"a":1,"b":[1,2.5,-0.0,null,true,"x"]}',
    b'{"a":1e-05}', b'{"a":0.00001}',  # a small float: the reference writes 1e-05, orjson 0.00001
    b'{"a":"\x7f"}', b'{"a":"\\u007f"}',  # DEL: escaped by the reference only
    b'{"a":1,"a":2}',  # a duplicated member
    b'{"a": 1}', b'{"b":1,"a":2}', b'{"a":"\\u00e9"}', '{"a":"é"}'.encode(),
    b'{"a":123456789012345678901234567890}', b'{"a":"\\ud800"}', b'{"a":NaN}', b'[1,2', b'',
])
@pytest.mark.parametrize("sort_keys", [False, True])
def test_canonical_tree_vouches_only_for_what_the_strict_check_accepts(data, sort_keys):
    """The fast path may decline (None) but never accepts bytes the strict parse-and-re-encode
    refuses, and when it accepts, it gives the strict path's tree."""
    encoder = canonical.dumps_sorted if sort_keys else canonical.dumps
    try:
        strict = canonical.loads(data)
        accepted = encoder(strict) == data
    except (canonical.DecodeError, TypeError, ValueError):
        accepted = False
    fast = canonical.canonical_tree(data, sort_keys=sort_keys)
    if fast is not None:
        assert accepted and fast == strict
    if data in (b'{"a":1,"b":[1,2.5,-0.0,null,true,"x"]}',):
        assert fast is not None  # the common case takes the fast path
