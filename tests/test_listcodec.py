"""Item-by-item list encoding (overnight.codec.listcodec): a saver that stores a growing message
list again at every checkpoint converts only the new items -- but what it stores and returns must
be exactly what the canonical codec gives, whatever the caller did to the items in between (edit
one in place, replace one, reorder a dict inside one), and a value it returns is the caller's to
change without changing anything it returns later."""

from __future__ import annotations

import random
import sys
import types
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic import BaseModel, create_model

from overnight.codec.canonical import decode, encode
from overnight.codec.listcodec import ListCodec
from overnight.errors import DecodeError, EncodeError


class Shout(HumanMessage):
    """A message class of its own (same members as HumanMessage)."""


def _transcript(n: int, seed: int = 1) -> list:
    rng = random.Random(seed)
    out: list = []
    for i in range(n):
        text = " ".join(rng.choice(["tool", "plan", "ok", "naïve", "🧪", "x" * 40]) for _ in range(rng.randrange(1, 60)))
        kind = i % 3
        if kind == 0:
            out.append(HumanMessage(text, id=f"h{i}"))
        elif kind == 1:
            out.append(AIMessage(text, id=f"a{i}", additional_kwargs={"n": i, "f": 0.5, "t": (1, 2)},
                                 usage_metadata={"input_tokens": i, "output_tokens": 1, "total_tokens": i + 1}))
        else:
            out.append(ToolMessage(text, tool_call_id=f"c{i}", id=f"t{i}"))
    return out


def _same(codec: ListCodec, value: list) -> bytes:
    data = codec.encode(value)
    assert data == encode(value)
    return data


def test_growing_list_encodes_and_decodes_exactly_as_the_codec() -> None:
    enc, dec = ListCodec(), ListCodec()
    msgs = _transcript(40)
    for n in range(1, 41):
        data = _same(enc, msgs[:n])
        got = dec.decode(data)
        assert got == decode(data) == msgs[:n]
        assert [type(m) for m in got] == [type(m) for m in msgs[:n]]


def test_items_changed_in_place_are_encoded_again() -> None:
    """The same objects, changed in place between two calls: a field reassigned, a nested dict
    changed or reordered, a number turned into a bool of equal value, fields set changed."""
    enc = ListCodec()
    msgs = _transcript(30)
    _same(enc, msgs)
    msgs[1].additional_kwargs["n"] = True  # == 1 in Python, but a different stored value
    _same(enc, msgs)
    msgs[4].additional_kwargs["n"] = 4.0
    _same(enc, msgs)
    kw = msgs[7].additional_kwargs
    msgs[7].additional_kwargs = {k: kw[k] for k in reversed(kw)}  # same members, other order
    _same(enc, msgs)
    msgs[10].content = msgs[10].content + "!"
    _same(enc, msgs)
    msgs[13].name = "someone"  # also changes the model's fields set
    _same(enc, msgs)
    msgs[16].additional_kwargs["t"] = [1, 2]  # a tuple turned list
    _same(enc, msgs)


def test_decoded_items_are_fresh_copies() -> None:
    dec = ListCodec()
    data = encode(_transcript(20))
    first = dec.decode(data)
    first[1].additional_kwargs["n"] = "changed"
    first[2].content = "changed"
    again = dec.decode(data)
    assert again == decode(data)
    assert again[1] is not first[1]


def test_decode_reuses_only_identical_bytes() -> None:
    """A list that shares a prefix with an earlier one, then differs (an edit, a shorter list, a
    reordered one) decodes exactly as the codec decodes it."""
    dec = ListCodec()
    msgs = _transcript(30)
    dec.decode(encode(msgs))
    edited = [*msgs[:10], HumanMessage("edited", id="e"), *msgs[11:]]
    for value in (edited, msgs[:12], msgs[::-1], msgs + msgs[:3], []):
        data = encode(value)
        assert dec.decode(data) == decode(data) == value


def test_errors_are_those_of_the_codec() -> None:
    codec = ListCodec()
    msgs = _transcript(12)
    codec.encode(msgs)
    with pytest.raises(EncodeError) as exc:
        codec.encode([*msgs, object()])
    assert exc.value.path == "value[12]"
    data = encode(msgs)
    codec.decode(data)
    with pytest.raises(DecodeError):
        codec.decode(data[:-1] + b',{"$t":"nope"}]')


def test_values_that_are_not_lists_or_not_remembered_still_round_trip() -> None:
    """Short lists, non-lists, and items whose pickled state would not determine their encoding
    (a set, a class of its own) go through the codec as usual."""
    codec = ListCodec()
    for value in ({"a": [1, 2]}, [1, 2], [{1, 2}, frozenset({3})] * 6, list(range(20)), ["x"] * 9):
        data = codec.encode(value)
        assert data == encode(value)
        assert codec.decode(data) == decode(data)


def test_changes_that_leave_an_item_equal_in_python_are_encoded_again() -> None:
    """A change that leaves an item equal in Python but encodes differently -- a dict key 1
    turned True, an empty member filled in place, a model's class or fields set changed -- is
    encoded again (whatever the codec remembers of the item, it is not equality)."""
    enc = ListCodec()
    rows = [{"s": "x" * 40, "k": [], 1: "one"} for _ in range(10)]
    _same(enc, rows)
    value = rows[3][1]
    del rows[3][1]
    rows[3][True] = value  # same value object at the same place, under a key equal to the old one
    _same(enc, rows)
    rows[5]["k"].append(0.0)  # an empty member filled in place
    _same(enc, rows)
    rows[6]["k"] = rows[6]["k"]  # the same object put back: unchanged
    _same(enc, rows)

    msgs = _transcript(30)
    _same(enc, msgs)
    msgs[0].additional_kwargs["new"] = {"deep": [1]}  # was empty
    _same(enc, msgs)
    msgs[0].additional_kwargs["new"]["deep"].append(2)  # nested, in place
    _same(enc, msgs)
    msgs[3].__pydantic_fields_set__.add("name")  # the fields set, in place
    _same(enc, msgs)
    msgs[6].__class__ = type(msgs[6]).__mro__[0]  # the same class: unchanged
    _same(enc, msgs)
    msgs[9].__class__ = Shout  # a HumanMessage turned a subclass, every member the same object
    _same(enc, msgs)


def test_decoded_objects_encoded_again_give_the_codec_bytes() -> None:
    """A saver hands back what it loaded: changed in place before they come back, those objects
    are encoded as they are now."""
    codec = ListCodec()
    data = encode(_transcript(24))
    got = codec.decode(data)
    assert codec.encode(got) == data
    got = codec.decode(data)
    got[2].content = "edited"
    got[4].additional_kwargs["n"] = True
    got[7].response_metadata["model"] = "m"
    assert codec.encode(got) == encode(got) != data


def test_decode_refuses_what_the_codec_refuses() -> None:
    """Attacker (round 33): bytes that share items with a list decoded before but are not JSON --
    a trailing comma, a "]" in the middle, an append ending in ",]" -- fail as the codec fails;
    before, the reuse of remembered items accepted them."""
    codec = ListCodec()
    items = [{"role": "user", "content": f"message number {i} with some padding text"} for i in range(10)]
    good = encode(items)
    codec.decode(good)
    i0, i1 = encode(items[0]), encode(items[1])
    for bad in (b"[" + i0 + b",]", b"[" + i0 + b"]]", b"[" + i0 + b"]" + i1 + b"]", b"[" + i0 + b"," + i1 + b",]",
                good[:-1] + b",]"):
        with pytest.raises(DecodeError):
            decode(bad)
        with pytest.raises(DecodeError):
            codec.decode(bad)
    assert codec.decode(good) == items


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch):
    """A module of its own for the classes a test defines (then shadows, or registers a codec for);
    what the registry learned about it is forgotten afterwards."""
    from overnight.codec import registry

    name = "listcodec_test_models"
    mod = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, mod)
    yield mod
    registry.forget_modules({name})


def _model(mod: types.ModuleType, **fields: Any) -> type[BaseModel]:
    """A model class ``Note`` defined at the top of ``mod`` (shadowing the one there before)."""
    cls = create_model("Note", __module__=mod.__name__, text=(str, ...), **fields)
    cls.__qualname__ = "Note"
    mod.Note = cls
    return cls


def test_a_remembered_item_whose_class_was_shadowed_is_refused_as_the_codec_refuses(module) -> None:
    """A notebook cell run again defines the class anew: the old objects' class can no longer be
    found by its name, so the codec refuses to store them -- the remembered bytes must not slip past."""
    note = _model(module)
    items = [note(text=f"note {i} " + "x" * 40) for i in range(10)]
    enc = ListCodec()
    _same(enc, items)
    _model(module)  # shadowed
    with pytest.raises(EncodeError, match="could not be found again"):
        encode(items)
    with pytest.raises(EncodeError, match="could not be found again"):
        enc.encode(items)


def test_a_remembered_decoded_list_is_not_reused_once_its_class_was_shadowed(module) -> None:
    """Decoding the same bytes after the class was defined anew (another field) gives what the codec
    gives: objects of the new class, validated -- not the old objects' state under the new class."""
    note = _model(module)
    data = encode([note(text=f"note {i} " + "x" * 40) for i in range(10)])
    dec = ListCodec()
    assert [type(v) for v in dec.decode(data)] == [note] * 10
    new = _model(module, n=(int, 7))
    got = dec.decode(data)
    assert got == decode(data)
    assert [type(v) for v in got] == [new] * 10 and all(v.n == 7 for v in got)


def test_a_codec_registered_after_items_were_remembered_is_used(module) -> None:
    """``register_codec`` (or ``register_type``, ``forget_modules``) changes what a value encodes to;
    remembered bytes and values made before it are dropped."""
    from overnight.codec.registry import register_codec

    note = _model(module)
    items = [note(text=f"note {i} " + "x" * 40) for i in range(10)]
    enc, dec = ListCodec(), ListCodec()
    old = _same(enc, items)
    dec.decode(old)
    register_codec(note, lambda v: {"short": v.text[:6]}, lambda t: note(text=t["short"]), name="note-short")
    new = _same(enc, items)
    assert new != old
    assert dec.decode(new) == decode(new) == [note(text=v.text[:6]) for v in items]


def test_a_registered_class_defined_again_decodes_as_the_codec_decodes(module) -> None:
    """Registered, then shadowed: the codec still loads the registered (old) class; a remembered
    value must not come back as the new class (pickle looks classes up by name) without its checks."""
    from overnight.codec.registry import register_type

    old = register_type(_model(module))
    data = encode([old(text=f"note {i} " + "x" * 40) for i in range(10)])
    dec = ListCodec()
    dec.decode(data)
    _model(module, n=(int, 7))  # defined again
    got = dec.decode(data)
    assert got == decode(data) and [type(v) for v in got] == [old] * 10
    fresh = ListCodec()  # a codec that never saw the old class: decodes too, never raises
    assert fresh.decode(data) == decode(data) and fresh.decode(data) == decode(data)


def test_a_registered_class_defined_in_a_function_round_trips(module) -> None:
    """pickle cannot find such a class again: its items are converted on every call, never kept."""
    from overnight.codec.registry import register_type

    def make() -> type[BaseModel]:
        class Local(BaseModel):
            text: str
        return Local

    local = register_type(make())
    items = [local(text=f"note {i} " + "x" * 40) for i in range(10)]
    codec = ListCodec()
    data = _same(codec, items)
    assert _same(codec, items) == data
    assert codec.decode(data) == decode(data) == items and codec.decode(data) == items
