"""What a restart keeps, and how it comes back (issue 13).

- ``select``: which names are kept, and in plain words why the others are not;
- ``pickling``: one value to one file, never touching CUDA, large buffers out of band;
- ``store``: the private per-kernel store (save under a deadline, restore, expiry);
- ``snapshot``: CPU copies of GPU objects after each successful cell (``%cudaguard keep``).

Pure logic: no IPython, no ipywidgets; torch and numpy are used only where already imported.
The notebook side is ``notebook/keep_glue.py``.
"""
