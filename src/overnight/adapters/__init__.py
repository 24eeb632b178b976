"""Adapters that put overnight under other agent frameworks."""
