"""The attack table (see :mod:`overnight.bench.attacks`): every attack on the trust boundary, N
times on every store, counted as refused / loaded.

    .venv/bin/python scripts/attack_table.py --trials 5
"""

import sys

from overnight.bench.attacks import main

if __name__ == "__main__":
    sys.exit(main())
