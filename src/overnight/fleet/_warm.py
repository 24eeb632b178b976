"""Imported by a worker's fork server after overnight itself: loads what every session would
otherwise load again -- the default tokenizer's vocabulary (~2 s of parsing; immutable data) --
so each forked session starts with it in memory."""

try:
    from overnight.tokens import tokenizer_for

    tokenizer_for("o200k_base")
except Exception:  # noqa: BLE001 - a session loads it itself (and reports any problem) if this fails
    pass
