"""Files handed from one process of a kernel to the next (the blocking-mode injection, the kept
variables, the cells for a replay): ``keys`` says where a kernel's are, ``private`` makes,
writes and reads them as this user's alone.

The lowest layer: standard library only, imported by ``restart``, ``keep`` and ``replay``."""
