"""Item-by-item list encoding (overnight.codec.listcodec): a saver that stores a growing message
list again at every checkpoint converts only the new items -- but what it stores and returns must
be exactly what the canonical codec gives, whatever the caller did to the items in between (edit
one in place, replace one, reorder a dict inside one), and a value it returns is the caller's to
change without changing anything it returns later."""

from __future__ import annotations

import random

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

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
