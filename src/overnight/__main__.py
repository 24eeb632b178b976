"""``python -m overnight`` is the ``overnight`` command."""

from overnight.cli import main

main()
