"""Every thread's Python stack, on demand, from a running model.

A served Python model registers :data:`STACKS_SIGNAL` at ``initialize``: on that signal its stub
writes the stack of each of its threads to its stderr, which is tritonserver's log (the stubs inherit
the server's descriptors). A model that stopped answering can so be read without stopping it:
``kill -USR1 <stub pid>``, or :meth:`tritonbundle.served.ServedRepository.write_stacks` for every stub of
a server, one at a time, each under a line naming it (the benchmark does this when a server stops
answering). Python's ``faulthandler`` writes from
its C signal handler, without the GIL, so it works while a thread holds the GIL or waits in C code
(the Python frame that called into C is the last one shown).

The Python backend's stub handles SIGINT and SIGTERM only (python_backend r24.10 ``src/pb_stub.cc``,
``main``), so SIGUSR1 is free.
"""

from __future__ import annotations

import faulthandler
import signal

STACKS_SIGNAL = signal.SIGUSR1


def dump_stacks_on_signal() -> None:
    """Write every thread's stack to stderr on :data:`STACKS_SIGNAL` (module docstring)."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)
