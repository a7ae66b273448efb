"""The process-wide settings a cell may change without binding a name: the process's own (its
environment, working directory, import path, warnings filters, recursion limit, profile and
trace functions), numpy's and
torch's where imported. Read at every cell's end by the recorder (``record.py``): a cell that
moved one runs again, as a seed does, even where it set it through a notebook function
(``def seed_everything(s): os.environ["PYTHONHASHSEED"] = str(s); ...``).

Each is read by the cheapest reader that sees every change: a C getter, or the object a setter
replaces (numpy keeps its error handling and print options in context variables), never a
public getter that builds a new value at each call where another exists.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

Settings = tuple[tuple[str, ...], tuple[Any, ...]]  # (the settings' names, their values)
_Readers = tuple[tuple[str, ...], list[Callable[[], Any]]]
_UNREADABLE = object()
# What libraries set as they are imported: a cell that loaded modules is not said to have set
# them (its new process's imports set them again).
SET_WHILE_IMPORTING = frozenset({"os.environ", "sys.path", "warnings.filterwarnings"})


def process_settings() -> Settings:
    """The settings' names and values now; ``_UNREADABLE`` for one that cannot be read."""
    names, readers = _settings_readers(sys.modules.get("torch"), sys.modules.get("numpy"))
    try:
        return names, tuple([read() for read in readers])  # one pass, where every reader answers
    except Exception:
        pass
    found = []
    for read in readers:
        try:
            found.append(read())
        except Exception:
            found.append(_UNREADABLE)
    return names, tuple(found)


def settings_changed(before: Settings | tuple[()], after: Settings) -> tuple[str, ...]:
    """The settings whose value moved from ``before`` to ``after``, by the call that sets them;
    those read at both ends only (torch imported in between: nothing of it was set before)."""
    if not before:
        return ()
    if before[0] is after[0]:
        pairs: Any = zip(before[0], before[1], after[1], strict=True)
    else:
        now = dict(zip(*after, strict=True))
        pairs = ((n, was, now[n]) for n, was in zip(*before, strict=True) if n in now)
    moved = {
        name
        for name, was, now in pairs
        if was is not _UNREADABLE and now is not _UNREADABLE and was != now
    }
    return tuple(sorted(moved))


# Set again by a replay where a cell that failed changed them (settings_changed's names).
SET_AGAIN = frozenset({"os.environ", "os.chdir"})


def set_before_failing(
    before: Settings | tuple[()], after: Settings, changed: tuple[str, ...], failed: bool
) -> tuple[tuple[tuple[str, str | None], ...], str]:
    """What a cell that failed set in ``os.environ`` (key, value; None where it removed the
    key) and the directory it moved to ("" where it did not): plain values, which a replay
    sets again for a cell it does not run. Nothing for a cell that succeeded."""
    if not failed or SET_AGAIN.isdisjoint(changed) or not before:
        return (), ""
    was, now = dict(zip(*before, strict=True)), dict(zip(*after, strict=True))
    environ: list[tuple[str, str | None]] = []
    if "os.environ" in changed:
        # ``os.environ._data`` as read (bytes on POSIX): decoded as ``os.environ`` decodes it
        decode_key = getattr(os.environ, "decodekey", str)
        decode_value = getattr(os.environ, "decodevalue", str)
        old, new = was["os.environ"], now["os.environ"]
        for key in sorted(old.keys() | new.keys(), key=decode_key):
            if key not in new:
                environ.append((decode_key(key), None))
            elif old.get(key) != new[key]:
                environ.append((decode_key(key), decode_value(new[key])))
    return tuple(environ), now["os.chdir"] if "os.chdir" in changed else ""


def set_again(environ: tuple[tuple[str, str | None], ...], cwd: str, keep: frozenset[str]) -> None:
    """What a failed cell set (``set_before_failing``), set again here; the variables in ``keep``
    stay as this process has them (the restart's own ``CUDA_LAUNCH_BLOCKING``)."""
    for key, value in environ:
        if key in keep:
            continue
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if cwd:
        os.chdir(cwd)


# ((torch, numpy), the readers), found once per pair of modules
_READERS: list[tuple[tuple[Any, Any], _Readers]] = []


def _settings_readers(torch: Any, numpy: Any) -> _Readers:
    if _READERS and _READERS[0][0][0] is torch and _READERS[0][0][1] is numpy:
        return _READERS[0][1]
    readers = _process_readers()
    if numpy is not None:
        readers += _numpy_readers(numpy)
    if torch is not None:
        readers += _torch_readers(torch)
    found = (tuple(name for name, _ in readers), [read for _, read in readers])
    _READERS[:] = [((torch, numpy), found)]
    return found


def _process_readers() -> list[tuple[str, Callable[[], Any]]]:
    # ``os.environ`` keeps its values in a dict (``os._Environ._data``): copied in C.
    data = getattr(os.environ, "_data", None)
    environ = data.copy if isinstance(data, dict) else (lambda: dict(os.environ))
    return [
        ("os.environ", environ),
        ("os.chdir", os.getcwd),
        ("sys.path", lambda: tuple(sys.path)),  # (``sys.path = [...]`` binds another list)
        ("warnings.filterwarnings", lambda: tuple(warnings.filters)),
        ("sys.setrecursionlimit", sys.getrecursionlimit),
        ("unittest.mock.patch", _started_patches),
        # A profile or trace function a cell installs (a call counter, a line tracer) runs at
        # every later call in this thread: C getters (Python/sysmodule.c), a few ns each.
        ("sys.setprofile", sys.getprofile),
        ("sys.settrace", sys.gettrace),
        # The standard library's own, which change what later cells compute or log: where
        # their module is not imported (yet), unreadable, so importing it sets nothing.
        ("decimal.setcontext", _decimal_context),
        ("sys.set_int_max_str_digits", getattr(sys, "get_int_max_str_digits", _unreadable)),
        ("sys.setswitchinterval", sys.getswitchinterval),
        ("logging.disable", _logging_disabled),
        ("socket.setdefaulttimeout", _socket_timeout),
    ]


def _unreadable() -> Any:
    return _UNREADABLE


def _decimal_context() -> Any:
    """The current ``decimal`` context's settings (``setcontext``, ``getcontext().prec = 5``),
    not its flags, which any inexact division raises (Lib/_pydecimal.py, ``Context``)."""
    decimal = sys.modules.get("decimal")
    if decimal is None:
        return _UNREADABLE
    # One C call gives them all (Modules/_decimal/_decimal.c and Lib/_pydecimal.py,
    # ``Context.__reduce__``: prec, rounding, Emin, Emax, capitals, clamp, flags, traps): 0.37 us,
    # where reading each and the traps' mapping took 0.8.
    state = decimal.getcontext().__reduce__()[1]
    return (*state[:6], tuple(state[7]))


def _logging_disabled() -> Any:
    logging = sys.modules.get("logging")
    return _UNREADABLE if logging is None else logging.root.manager.disable


def _socket_timeout() -> Any:
    socket = sys.modules.get("socket")
    return _UNREADABLE if socket is None else socket.getdefaulttimeout()


def _started_patches() -> tuple[int, ...]:
    """The patchers ``unittest.mock`` started and did not stop (``patch("torch.nn.functional.
    gelu", f).start()``; Lib/unittest/mock.py keeps them in ``_patch._active_patches``): what
    they replaced lives in a library, which a new process imports afresh, and the cell's text
    may name it only in a string."""
    mock = sys.modules.get("unittest.mock")
    return tuple(map(id, mock._patch._active_patches)) if mock is not None else ()


def _numpy_readers(numpy: Any) -> list[tuple[str, Callable[[], Any]]]:
    """``np.seterr`` and ``np.set_printoptions``: numpy 2 keeps each in a context variable
    (``numpy/_core/_ufunc_config.py``, ``arrayprint.py``), set to a new object by each call;
    else the public getters."""
    core = getattr(numpy, "_core", None)
    errors = getattr(getattr(core, "_ufunc_config", None), "_extobj_contextvar", None)
    printing = getattr(getattr(core, "arrayprint", None), "format_options", None)
    error_reader = errors.get if errors is not None else numpy.geterr
    print_reader = printing.get if printing is not None else numpy.get_printoptions
    return [("numpy.seterr", error_reader), ("numpy.set_printoptions", print_reader)]


def _torch_readers(torch: Any) -> list[tuple[str, Callable[[], Any]]]:
    """Each by its C getter where this torch has it (one call, where ``torch.backends``' module
    properties cost a Python frame each), else the public reader."""
    c = torch._C

    def direct(private: str, public: Callable[[], Any]) -> Callable[[], Any]:
        found = getattr(c, private, None)
        return found if callable(found) else public

    readers: list[tuple[str, Callable[[], Any]]] = [
        ("torch.set_grad_enabled", torch.is_grad_enabled),
        ("torch.set_default_dtype", torch.get_default_dtype),
        (
            "torch.use_deterministic_algorithms",
            direct("_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
        ),
        (
            "torch.set_float32_matmul_precision",
            direct("_get_float32_matmul_precision", torch.get_float32_matmul_precision),
        ),
        (
            "torch.backends.cudnn.deterministic",
            direct("_get_cudnn_deterministic", lambda: torch.backends.cudnn.deterministic),
        ),
        (
            "torch.backends.cudnn.benchmark",
            direct("_get_cudnn_benchmark", lambda: torch.backends.cudnn.benchmark),
        ),
        (
            "torch.backends.cudnn.enabled",
            direct("_get_cudnn_enabled", lambda: torch.backends.cudnn.enabled),
        ),
        (
            "torch.backends.cuda.matmul.allow_tf32",
            direct("_get_cublas_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
        ),
        ("torch.set_num_threads", torch.get_num_threads),
        ("torch.set_flush_denormal", _denormals_kept),
        ("torch.autograd.set_detect_anomaly", torch.is_anomaly_enabled),
        # ``set_printoptions`` sets attributes of one object: its ``__dict__`` copied in C.
        ("torch.set_printoptions", vars(torch._tensor_str.PRINT_OPTS).copy),
        # Hooks on every module (``register_module_forward_hook``): how many of each kind.
        (
            "torch.nn.modules.module.register_module_forward_hook",
            _global_hooks(torch.nn.modules.module),
        ),
        # Hooks on every optimizer's step (``register_optimizer_step_pre_hook``; its module is
        # no attribute of torch.optim).
        (
            "torch.optim.optimizer.register_optimizer_step_pre_hook",
            _global_hooks(sys.modules[torch.optim.Optimizer.__module__]),
        ),
    ]
    # Autocast left on (``torch.autocast("cpu").__enter__()``, ``set_autocast_enabled``): on
    # and to what dtype, per device; the getters that take a device are torch >= 2.4's.
    try:
        for kind in ("cpu", "cuda"):
            torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
            readers.append((f"torch.autocast({kind!r})", _autocast(torch, kind)))
    except (TypeError, AttributeError, RuntimeError):
        pass
    if hasattr(torch, "is_inference_mode_enabled"):  # ``torch.inference_mode().__enter__()``
        readers.append(("torch.inference_mode", torch.is_inference_mode_enabled))
    # The default pack/unpack hooks of what autograd saves, left pushed
    # (``saved_tensors_hooks(pack, unpack).__enter__()``, torch/autograd/graph.py): the top of
    # their stack, by identity (ignoring tracing, where reading it would raise).
    top = getattr(c._autograd, "_top_saved_tensors_default_hooks", None)
    if callable(top):
        readers.append(("torch.autograd.graph.saved_tensors_hooks", partial(top, True)))
    # ``disable_saved_tensors_hooks(message).__enter__()``: the message, None while enabled.
    disabled = getattr(c._autograd, "_saved_tensors_hooks_get_disabled_error_message", None)
    if callable(disabled):
        readers.append(("torch.autograd.graph.disable_saved_tensors_hooks", disabled))
    # Settings with a C getter only (torch/csrc/Module.cpp), where this torch has them: which
    # attention kernels and reduced-precision paths run, ``use_deterministic_algorithms``'
    # ``warn_only``.
    for name, private in (
        ("torch.use_deterministic_algorithms", "_get_deterministic_algorithms_warn_only"),
        ("torch.set_warn_always", "_get_warnAlways"),
        # (``set_multithreading_enabled(False).__enter__()``: autograd's backward on one thread)
        ("torch.autograd.set_multithreading_enabled", "_is_multithreading_enabled"),
        ("torch.backends.cudnn.allow_tf32", "_get_cudnn_allow_tf32"),
        ("torch.backends.cuda.enable_flash_sdp", "_get_flash_sdp_enabled"),
        ("torch.backends.cuda.enable_mem_efficient_sdp", "_get_mem_efficient_sdp_enabled"),
        ("torch.backends.cuda.enable_math_sdp", "_get_math_sdp_enabled"),
        ("torch.backends.cuda.enable_cudnn_sdp", "_get_cudnn_sdp_enabled"),
        (
            "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
            "_get_cublas_allow_fp16_reduced_precision_reduction",
        ),
        (
            "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
            "_get_cublas_allow_bf16_reduced_precision_reduction",
        ),
        ("torch.backends.mkldnn.enabled", "_get_mkldnn_enabled"),
    ):
        getter = getattr(c, private, None)
        if callable(getter):
            readers.append((name, getter))
    # The default process group (``dist.init_process_group``, ``destroy_process_group``):
    # torch/distributed/distributed_c10d.py keeps it in ``_world._default_pg``, where no name
    # of the notebook holds it; read from the instance's dict (one C call), by identity.
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    if world is not None and "_default_pg" in vars(world):
        readers.append(
            ("torch.distributed.init_process_group", partial(vars(world).get, "_default_pg"))
        )
    # ``set_default_device`` keeps a DeviceContext in a thread-local (torch/__init__.py): read
    # there, where ``get_default_device()`` walks the mode stack (2 us). A thread-local keeps
    # one ``__dict__`` per thread for the thread's life (Modules/_threadmodule.c): the main
    # thread's, where cells run, is read by one C call (45 ns, where ``getattr`` of a name
    # not set costs an AttributeError: 300 ns).
    context = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if context is not None:
        if threading.current_thread() is threading.main_thread():
            device = partial(vars(context).get, "device_context")
        else:
            device = partial(getattr, context, "device_context", None)
        readers.append(("torch.set_default_device", device))
    return readers


_DENORMAL = 1e-310  # (a name, not a literal: a product of literals is folded when compiled)


def _denormals_kept() -> bool:
    """``set_flush_denormal(True)`` has no getter: it sets the CPU's flush-to-zero flags, which
    Python's own float product and comparison obey too. A bool: comparing the products later
    would itself be flushed."""
    return _DENORMAL * 1.0 != 0.0


def _autocast(torch: Any, device: str) -> Callable[[], Any]:
    enabled, dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
    return lambda: (enabled(device), dtype(device))


def _global_hooks(module: Any) -> Callable[[], Any]:
    """How many hooks each of ``module``'s global hook dicts holds (``_global_...``)."""
    found = [v for k, v in vars(module).items() if k.startswith("_global_") and isinstance(v, dict)]
    return lambda: tuple(map(len, found))
