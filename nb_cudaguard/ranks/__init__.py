"""Jobs of several processes (torchrun, mp.spawn, accelerate, DeepSpeed): which rank failed.

In a rank: ``record`` (the per-rank JSON record and torchelastic's error-file form), ``peers``
(the stop through the job's own c10d store), ``in_rank`` (``guard()`` in a rank), ``launched`` (a
launcher's failure in a notebook, explained from its children's records). On the launcher's
side: ``logs`` (console logs, log directories, tracebacks and records read per rank), ``verdict``
(culprit, victims, collateral), ``rerun`` (the launcher's own re-run command), ``report`` and
``explain`` (what `nb-cudaguard explain` prints).
"""
