"""From an exception or a text to a ``Diagnosis``, and from a ``Diagnosis`` to text and HTML.

Pure: no IPython, and torch only as objects handed in (evidence reads CPU tensors and module
attributes, never CUDA memory).
"""
