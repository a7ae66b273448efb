"""Multi-process jobs: each rank's failure record, the peers' fast stop, and the culprit's verdict.

``record`` (the per-rank JSON record and torchelastic's error-file form), ``peers`` (the stop
through the job's own c10d store), ``in_rank`` (``guard()`` in a rank), ``launched`` (a
launcher's failure in a notebook, explained from its children's records).
"""
