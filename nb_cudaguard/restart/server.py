"""Find the Jupyter server that manages this kernel, and talk to its REST API.

The server is the nearest ancestor process with a ``jpserver-<pid>.json`` runtime file; its token
comes from that file and is never shown (jupyter_server/serverapp.py writes it, with the
server's url and token). ``jupyter_server`` itself is never
imported: it costs ~1.7 s.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Server:
    """A running Jupyter server, as its runtime file describes it. The token is never shown."""

    pid: int
    url: str
    token: str = field(repr=False)
    source: str = ""  # the runtime file it was read from

    def api(self, path: str) -> str:
        return self.url.rstrip("/") + "/api/" + path.lstrip("/")


def ancestors(pid: int | None = None) -> list[int]:
    """Parent, grandparent, ... of ``pid`` (default: this process), nearest first (psutil)."""
    import psutil

    try:
        return [parent.pid for parent in psutil.Process(pid).parents()]
    except psutil.Error:
        return []


def runtime_dirs(connection: str | None) -> list[Path]:
    """Where server runtime files live: next to the kernel's connection file, and Jupyter's
    runtime directory (read from the environment or jupyter_core, never jupyter_server: slow)."""
    found: list[Path] = []
    if connection:
        found.append(Path(connection).resolve().parent)
    if os.environ.get("JUPYTER_RUNTIME_DIR"):
        found.append(Path(os.environ["JUPYTER_RUNTIME_DIR"]))
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        found.append(Path(jupyter_runtime_dir()))
    except Exception:
        pass
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def find_server(directories: Iterable[Path], candidate_pids: Sequence[int]) -> Server | None:
    """The server among ``candidate_pids`` (nearest ancestor first) with a runtime file."""
    servers: dict[int, Server] = {}
    for directory in directories:
        for path in [*directory.glob("jpserver-*.json"), *directory.glob("nbserver-*.json")]:
            try:
                info = json.loads(path.read_text(encoding="utf-8"))
                pid, url = int(info["pid"]), str(info["url"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            servers.setdefault(pid, Server(pid, url, str(info.get("token") or ""), str(path)))
    for pid in candidate_pids:
        if pid in servers:
            return servers[pid]
    return None


def api_request(server: Server, path: str, method: str, timeout: float) -> int:
    request = urllib.request.Request(
        server.api(path),
        method=method,
        data=b"" if method == "POST" else None,
        headers={"Authorization": f"token {server.token}"},
    )
    # The server is local: never route this through http(s)_proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as response:
        return int(response.status)


def server_knows_kernel(server: Server, kid: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    if not server.token:
        return False  # a tokenless server refuses API writes (403): don't even try
    try:
        return api_request(server, f"kernels/{kid}", "GET", timeout) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False
