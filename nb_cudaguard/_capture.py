"""Tee file descriptor 2 while a cell runs: device assert lines are shown *and* captured.

The CUDA runtime prints device-side assert lines straight to fd 2, not to ``sys.stderr``
(FIELD_NOTES §1). ipykernel >= 6 has already pointed fd 2 at a pipe that its watcher thread
forwards to the notebook, sometimes late or under a later cell; older kernels leave fd 2 on the
server's terminal, where the user never looks. Either way Python cannot read the text back.

So while a cell runs, fd 2 points at our own pipe; a thread copies every byte to the previous
fd 2 (ipykernel's pipe or the terminal: the user sees exactly what they saw before) and keeps a
bounded copy for the diagnosis. ``stop()`` restores fd 2 *before* reading the rest, so nothing
written during the cell is lost and nothing is held back.

Why not wurlitzer: its ``pipes()`` hands captured text to Python file objects and replaces the
descriptor for good while active, which would hide the lines from a terminal or from ipykernel's
own forwarding unless we re-wrote them; a byte-for-byte tee to the saved descriptor is the small,
exact thing needed here and adds no runtime dependency.
"""

from __future__ import annotations

import os
import threading
import time

_KEEP = 256 * 1024  # bytes kept across cells: hundreds of thread lines fit, a runaway log does not


def _pending(fd: int | None) -> int | None:
    """Bytes waiting in a pipe (None where the platform cannot say, or it is closed)."""
    if fd is None:
        return None
    try:
        import array
        import fcntl
        import termios

        size = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, size, True)
        return int(size[0])
    except (ImportError, OSError):
        return None


class FdTee:
    """Copy everything written to ``fd`` to where it went before, and remember the tail of it."""

    def __init__(self, fd: int = 2, keep: int = _KEEP) -> None:
        self.fd = fd
        self.keep = keep
        self._depth = 0  # nested cells (a cell magic running shell.run_cell) share one tee
        self._saved: int | None = None
        self._write_end: int | None = None
        self._reader: threading.Thread | None = None
        self._read_end: int | None = None
        self._buffer = bytearray()
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._saved is not None

    def start(self) -> None:
        self._depth += 1
        if self._saved is not None:
            return
        read_end, write_end = os.pipe()
        saved = os.dup(self.fd)
        os.set_inheritable(saved, False)
        os.dup2(write_end, self.fd)
        self._saved, self._write_end, self._read_end = saved, write_end, read_end
        self._reader = threading.Thread(
            target=self._pump, args=(read_end, saved), name="nb_cudaguard-fd-tee", daemon=True
        )
        self._reader.start()

    def _pump(self, read_end: int, forward_to: int) -> None:
        try:
            while True:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                try:
                    os.write(forward_to, chunk)
                except OSError:
                    pass  # the user's stream went away: still keep our copy
                with self._lock:
                    self._buffer += chunk
                    if len(self._buffer) > self.keep:
                        del self._buffer[: len(self._buffer) - self.keep]
        finally:
            os.close(read_end)
            os.close(forward_to)

    def stop(self) -> None:
        """Give fd 2 back and wait until everything the cell wrote was forwarded and kept."""
        if self._depth > 0:
            self._depth -= 1
        if self._depth > 0 or self._saved is None:
            return
        saved, write_end, reader = self._saved, self._write_end, self._reader
        self._saved = self._write_end = self._reader = None
        os.dup2(saved, self.fd)  # from here on, fd 2 no longer feeds our pipe
        if write_end is not None:
            os.close(write_end)  # the last writer: the reader now sees EOF after the rest
        if reader is not None:
            # A child process started in the cell (DataLoader workers, subprocesses) may still
            # hold the pipe: then EOF never comes, and the reader keeps forwarding its output
            # (it owns ``saved`` and closes it at EOF). Wait only long enough to drain the pipe.
            deadline = time.monotonic() + 0.5
            reader.join(timeout=0.02)
            while reader.is_alive() and time.monotonic() < deadline:
                if _pending(self._read_end) == 0:
                    break
                reader.join(timeout=0.02)

    def close(self) -> None:
        self._depth = 1
        self.stop()

    def text(self) -> str:
        """What was captured so far (the tail), as text."""
        with self._lock:
            return self._buffer.decode("utf-8", errors="replace")

    def clear(self) -> None:
        with self._lock:
            self._buffer.clear()
