"""The ``%%cudacheck`` guard: a torch function mode that checks the inputs of assert-prone
operations before their kernels launch (``scope``), the per-op checks (``ops``), the kinds of
requirement they state (``requirements``), and ``GuardError`` (``errors``)."""
