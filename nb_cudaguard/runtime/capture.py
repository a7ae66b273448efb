"""Tee file descriptor 2 while a cell runs: device assert lines are shown *and* captured.

The CUDA runtime prints device-side assert lines straight to fd 2, not to ``sys.stderr``
(FIELD_NOTES §1). ipykernel >= 6 has already pointed fd 2 at a pipe that its watcher thread
forwards to the notebook, sometimes late or under a later cell; older kernels leave fd 2 on the
server's terminal, where the user never looks. Either way Python cannot read the text back.

So while a cell runs, fd 2 points at our own pipe; a thread copies every byte to the previous
fd 2 (ipykernel's pipe or the terminal: the user sees exactly what they saw before) and keeps a
bounded copy for the diagnosis. ``stop()`` restores fd 2, then waits until the reader has passed
everything written before that: nothing written during the cell is lost or held back.

Why not wurlitzer: its ``pipes()`` hands captured text to Python file objects and replaces the
descriptor for good while active, which would hide the lines from a terminal or from ipykernel's
own forwarding unless we re-wrote them; a byte-for-byte tee to the saved descriptor is the small,
exact thing needed here and adds no runtime dependency.
"""

from __future__ import annotations

import contextlib
import os
import threading

_KEEP = 256 * 1024  # bytes kept across cells: hundreds of thread lines fit, a runaway log does not


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class FdTee:
    """Copy everything written to ``fd`` to where it went before, and remember the tail of it.

    One pipe and one reader thread live as long as the tee (a thread per cell would cost more
    than the rest of the extension); each cell only swaps ``fd`` in and out with ``dup2``.
    """

    def __init__(self, fd: int = 2, keep: int = _KEEP) -> None:
        self.fd = fd
        self.keep = keep
        self._depth = 0  # nested cells (a cell magic running shell.run_cell) share one tee
        self._saved: int | None = None  # where ``fd`` pointed before the current cell
        self._forward: int | None = None  # where the reader forwards to (stays after stop)
        self._read_end: int | None = None
        self._write_end: int | None = None
        self._reader: threading.Thread | None = None
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self._marker = b"\x00nb_cudaguard-drained-" + os.urandom(8).hex().encode() + b"\x00"
        self._drained = threading.Event()

    @property
    def active(self) -> bool:
        return self._saved is not None

    def start(self) -> None:
        self._depth += 1
        if self._saved is not None:
            return
        if self._reader is None:
            self._read_end, self._write_end = os.pipe()
            self._reader = threading.Thread(
                target=self._pump, args=(self._read_end,), name="nb_cudaguard-fd-tee", daemon=True
            )
            self._reader.start()
        assert self._write_end is not None
        if self._forward is not None and _same_file(self.fd, self._write_end):
            # Another redirector that started inside our last cell restored fd 2 to our pipe:
            # forwarding to fd 2 would loop, so forward where we did before.
            saved = os.dup(self._forward)
        else:
            saved = os.dup(self.fd)
        with self._lock:
            old, self._forward = self._forward, saved
        if old is not None:
            os.close(old)
        self._saved = saved
        os.dup2(self._write_end, self.fd)

    def _pump(self, read_end: int) -> None:
        marker, carry = self._marker, b""
        try:
            while True:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                data = carry + chunk
                carry = b""
                drained = marker in data
                if drained:
                    data = data.replace(marker, b"")
                else:
                    # Keep a possible start of the marker for the next read.
                    for size in range(min(len(marker) - 1, len(data)), 0, -1):
                        if marker.startswith(data[-size:]):
                            data, carry = data[:-size], data[-size:]
                            break
                with self._lock:
                    if data and self._forward is not None:
                        # If the user's stream went away, still keep our copy.
                        with contextlib.suppress(OSError):
                            os.write(self._forward, data)
                    self._buffer += data
                    if len(self._buffer) > self.keep:
                        del self._buffer[: len(self._buffer) - self.keep]
                if drained:
                    self._drained.set()
        finally:
            os.close(read_end)
            with self._lock:
                forward, self._forward = self._forward, None
            if forward is not None:
                os.close(forward)

    def stop(self, drain: bool = True) -> None:
        """Give ``fd`` back; with ``drain``, return once everything the cell wrote was forwarded
        and kept. Without it (a cell that succeeded: nothing to diagnose now) the reader catches
        up on its own, which spares every cell a round trip through the reader thread."""
        if self._depth > 0:
            self._depth -= 1
        if self._depth > 0 or self._saved is None:
            return
        saved, self._saved = self._saved, None
        assert self._write_end is not None
        # Hooks of other redirectors (wurlitzer, a capture magic) may not nest with ours: give
        # ``fd`` back only if it still points at our pipe, never undo someone else's change.
        if _same_file(self.fd, self._write_end):
            os.dup2(saved, self.fd)  # from here on, ``fd`` no longer feeds our pipe
        # ``saved`` stays open: the reader forwards to it until the next cell replaces it.
        # The pipe is first-in first-out: once the reader meets our marker, every byte written
        # before the swap has been forwarded and kept. Children started in the cell may still
        # write into the pipe later; the reader keeps forwarding that to ``saved``.
        if drain and self._reader is not None and self._reader.is_alive():
            self._drained.clear()
            os.write(self._write_end, self._marker)
            self._drained.wait(timeout=2)

    def close(self) -> None:
        """Stop, and release the pipe (the reader ends once no process holds it any more)."""
        self._depth = min(self._depth, 1)
        self.stop()
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None
        self._reader = None
        # The reader may still forward what children write; it ends at EOF, and the saved
        # descriptor is closed with it.

    def text(self) -> str:
        """What was captured so far (the tail), as text."""
        with self._lock:
            return self._buffer.decode("utf-8", errors="replace")

    def clear(self) -> None:
        with self._lock:
            self._buffer.clear()
