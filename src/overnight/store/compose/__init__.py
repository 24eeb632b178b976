"""Stores built over other stores: tiered (hot + cold archive packs), replicated (several media),
and a damaged medium set aside. Each is a :class:`~overnight.store.base.Store` and runs the
conformance module like any backend."""
