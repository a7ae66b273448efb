"""What a restart keeps, and how it comes back (issue 13).

- ``select``: which names are kept, and in plain words why the others are not;
- ``pickling``: one value to one file, never touching CUDA, large buffers out of band;
- ``store``: the private per-kernel store's API: ``save`` under a deadline, and the names of
  the modules by job: ``places`` (where, how much RAM), ``manifest``, ``saver`` (the thread),
  ``swap`` (the new keep in the earlier one's place), ``restoring``, ``expiry``;
- ``own_modules``: values that are globals of the notebook's own modules, bound back at restore;
- ``lifetime``: the one watcher per user that discards a keep once its kernel is gone;
- ``text``: what keep and restore say;
- ``snapshot``: CPU copies of GPU objects after each successful cell (``%cudaguard keep``).

Pure logic: no IPython, no ipywidgets, nothing of ``restart``; torch and numpy are used only
where already imported. The notebook side is ``notebook/keep_glue.py``.
"""
