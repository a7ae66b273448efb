"""Restarting a kernel from inside it: where it runs (``environment``), its Jupyter server
(``server``), the one-shot ``CUDA_LAUNCH_BLOCKING`` injection (``injection``) and the restart
methods (``methods``). Handed the IPython profile by the glue; never imports IPython."""
