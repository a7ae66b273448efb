"""Replay to the true line: the previous kernel's cells, kept across our restart (``history``),
and which of them rebuild what the namespace lacks now (``planner``). Pure: no IPython."""
