"""What reads the live process: the CUDA context probe, the fd 2 capture of device assert lines,
the per-cell tracker, blocking mode and ``%cudaguard status``."""
