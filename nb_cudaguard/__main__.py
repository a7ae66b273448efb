"""``python -m nb_cudaguard``: the command line (see ``nb_cudaguard.cli``)."""

from __future__ import annotations

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
