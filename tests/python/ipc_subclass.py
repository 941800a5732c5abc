"""A module that defines a Buffer subclass and records, when it is
imported, the descriptors of its process that a child process would
inherit: a receiver imports it while it rebuilds such a Buffer
(tests/python/test_ipc.py)."""

import cusafe
from test_ipc import inheritable_fds

AT_IMPORT = inheritable_fds()


class Lazy(cusafe.Buffer):
    """Found by the receiver only by importing this module."""
