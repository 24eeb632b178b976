"""Generic delegation for stores built over other stores (no hand-written forwarding methods).

:func:`forwarding` is a class decorator: every method of the :class:`~overnight.store.base.Store`
protocol the class does not define itself is added as a method that calls the same method of the
store held in one attribute (``self.hot``, ``self.primary``), with the protocol's docstring. A
wrapper so writes only what it changes; a method added to the protocol is forwarded at once.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

from overnight.store.base import Store

T = TypeVar("T", bound=type)

STORE_METHODS: tuple[str, ...] = tuple(
    name for name, value in inspect.getmembers(Store, callable)
    if not name.startswith("_") and name in {n for k in Store.__mro__ for n in vars(k)}
)
"""The methods of the store protocol (``commit``, ``get_objects``, ...), by name."""


def _forward(name: str, to: str) -> Callable[..., Any]:
    proto = getattr(Store, name)

    @functools.wraps(proto)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, to), name)(*args, **kwargs)

    method.__qualname__ = name
    return method


def forwarding(to: str) -> Callable[[T], T]:
    """``@forwarding("hot")``: forward every store method the class does not define to ``self.hot``."""

    def decorate(cls: T) -> T:
        for name in STORE_METHODS:
            if not any(name in vars(k) for k in cls.__mro__ if k is not object):
                setattr(cls, name, _forward(name, to))
        return cls

    return decorate
