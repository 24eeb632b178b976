"""``python -m overnight`` is the ``overnight`` command."""

from overnight.cli.app import main

main()
