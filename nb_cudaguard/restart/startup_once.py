# nb_cudaguard's one-shot IPython startup file (its restart). In the next start of ONE kernel, the
# one whose connection file hashes to the key in this file's name, it sets CUDA_LAUNCH_BLOCKING=1
# (a blocking restart) and loads the extension again (where the kernel that asked had it loaded),
# then removes itself and its data file. Every other IPython process of this profile (another
# kernel, a terminal, another virtual environment) leaves both alone. It imports nothing but the
# standard library itself; IPython imports nb_cudaguard to load the extension, after the variable
# is set, and a failure there (another environment, an older version) costs only the extension.
# It reads one JSON data file and executes nothing read from it. Safe to delete.
#
# This module's text *is* the startup file (nb_cudaguard/restart/injection.py copies it): so no
# docstring and no module-level name but the one function, which deletes itself after running, for
# IPython runs startup files in the user's namespace.


def _nb_cudaguard_once(
    script: str,
    connection: str | None = None,
    environ: dict[str, str] | None = None,
    now: float | None = None,
    shell: object = None,
) -> str:
    """Apply the pending restart meant for this kernel; returns what it did (one word).
    ``shell``: where the extension is loaded (default: the running IPython's)."""
    import hashlib
    import json
    import os
    import sys
    import time

    prefix, suffix = "0-nb_cudaguard-once-", ".py"
    allowed = {"CUDA_LAUNCH_BLOCKING": "1"}  # the only variable, with the only value, ever set
    marker = "NB_CUDAGUARD_BLOCKING_AFTER_CELL"  # runtime/blocking.py's MARKER
    ttl_s, max_bytes = 300.0, 4096

    name = os.path.basename(script)
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return "not-ours"
    key = name[len(prefix) : -len(suffix)]

    if connection is None:
        # ipykernel's application, if this process runs one (looked up, never imported).
        app_class = getattr(sys.modules.get("ipykernel.kernelapp"), "IPKernelApp", None)
        try:
            if app_class is not None and app_class.initialized():
                app = app_class.instance()
                connection = str(getattr(app, "abs_connection_file", app.connection_file))
        except Exception:
            connection = None
    if connection is None:
        # The launch arguments (IPython swaps sys.argv while it runs startup files).
        argv = list(getattr(sys, "orig_argv", None) or sys.argv)
        for index, arg in enumerate(argv):
            flag, _, value = arg.partition("=")
            if flag in ("-f", "--f"):
                connection = value or (argv[index + 1] if index + 1 < len(argv) else None)
                break
    if not connection:
        return "not-a-kernel"
    kernel = os.path.realpath(os.path.abspath(connection))
    if hashlib.sha256(kernel.encode()).hexdigest()[:24] != key:
        return "not-this-kernel"

    profile = os.path.dirname(os.path.dirname(os.path.abspath(script)))
    data_path = os.path.join(profile, "nb_cudaguard", f"pending-{key}.json")
    try:
        if os.path.getsize(data_path) > max_bytes:
            return "invalid"
        with open(data_path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return "no-data"
    if not isinstance(data, dict) or data.get("format") != 2:
        return "invalid"
    env, created, after_cell = data.get("env"), data.get("created"), data.get("after_cell")
    load = data.get("load_extension", False)
    if data.get("kernel") != kernel or env not in ({}, allowed) or not isinstance(load, bool):
        return "invalid"
    if not isinstance(created, (int, float)) or isinstance(created, bool):
        return "invalid"
    if after_cell is not None and (not isinstance(after_cell, int) or isinstance(after_cell, bool)):
        return "invalid"

    # This kernel's own files from here on: consume them once, whatever follows.
    for path in (script, data_path):
        try:  # noqa: SIM105 (no module-level import: this text runs in the user's namespace)
            os.remove(path)
        except OSError:
            pass
    now = time.time() if now is None else now
    if abs(now - created) > ttl_s:
        return "expired"  # a leftover of a restart that never happened
    if env:  # first: nothing below may import torch before the variable is set
        target = os.environ if environ is None else environ
        target.update(env)
        target[marker] = "" if after_cell is None else str(after_cell)
    if load:
        if shell is None:
            ipython = sys.modules.get("IPython")  # looked up: this process runs IPython
            shell = ipython.get_ipython() if ipython is not None else None
        if shell is None:
            return "applied"
        try:
            # Through IPython's extension manager, as %load_ext loads it, so that %unload_ext
            # and %reload_ext know it (a notebook's own %load_ext then says it is loaded).
            loaded = shell.extension_manager.load_extension("nb_cudaguard")  # type: ignore[attr-defined]
        except Exception as error:
            loaded = f"{type(error).__name__}: {error}"
        if loaded not in (None, "already loaded"):
            print(f"nb_cudaguard: not loaded after the restart ({loaded})", file=sys.stderr)
            return "applied-not-loaded"
    return "applied"


if __name__ == "__main__" and "__file__" in globals():
    try:  # noqa: SIM105
        _nb_cudaguard_once(__file__)
    except Exception:
        pass
    del _nb_cudaguard_once
