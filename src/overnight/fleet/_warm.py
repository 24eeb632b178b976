"""Imported by a worker's fork server after overnight itself: loads what every session would
otherwise load again, so each forked session starts with it in memory:

* the default tokenizer's vocabulary (~2 s of parsing; immutable data);
* the compiled regular expressions of :mod:`inspect` and :mod:`tokenize`, which every session
  uses to read its steps' source (a step's code digest) and which each forked session otherwise
  compiled anew (~70 ms per session under load, ``overnight bench fleet``'s profile).
"""

import inspect

try:
    from overnight.tokens import tokenizer_for

    tokenizer_for("o200k_base")
except Exception:  # noqa: BLE001 - a session loads it itself (and reports any problem) if this fails
    pass

try:
    from overnight.runtime.task import _source_digest

    _source_digest(inspect.getsource)  # a function whose source is on disk: tokenize's patterns
except Exception:  # noqa: BLE001 - a warm-up only
    pass

# Everything loaded so far lives as long as the fork server: move it out of the collector's reach,
# so a forked session's garbage collections do not walk -- and, through copy-on-write, copy -- the
# fork server's whole heap (the tokenizer's vocabulary alone is tens of MB). CPython's gc.freeze()
# exists for exactly this (pre-fork servers).
import gc  # noqa: E402

gc.freeze()
