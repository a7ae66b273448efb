"""A job of several processes (torchrun, mp.spawn, accelerate, DeepSpeed): which rank failed."""
