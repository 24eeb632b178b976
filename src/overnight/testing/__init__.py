"""Test support shipped with the package (internal): fault injection (:mod:`~overnight.testing.faults`).

Nothing in the library imports it; the test suite and ``overnight bench`` do."""
