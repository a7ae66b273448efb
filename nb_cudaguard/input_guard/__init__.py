"""The ``%%cudacheck`` guard: wrappers over torch's assert-prone ops that check their inputs
before their kernels launch (``scope``: ``guard()``, tying the other modules together), the
per-op checks (``ops``), the kinds of requirement they state (``requirements``), and
``GuardError`` (``errors``)."""
