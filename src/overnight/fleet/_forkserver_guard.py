"""Imported first by a worker's fork server (``set_forkserver_preload``): the fork server -- and,
through their own ``PR_SET_PDEATHSIG``, the sessions it forked -- die with the worker, as they
would with a machine that goes away. Import it nowhere else: it arranges for the importing
process to be killed when its parent dies."""

import ctypes
import signal

try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux: the sessions' claims expire instead
    pass
