"""Tee file descriptor 2 while a cell runs: device assert lines are shown *and* captured.

The CUDA runtime prints device-side assert lines straight to fd 2, not to ``sys.stderr``
(the CUDA Programming Guide's "Assertion" section: the message goes to the process's stderr).
ipykernel >= 6 has already pointed fd 2 at a pipe that its watcher thread
forwards to the notebook, sometimes late or under a later cell; older kernels and terminal IPython
leave fd 2 on a terminal. Either way Python cannot read the text back.

So fd 2 points at our pipe, and a small **child process** copies every byte, in order, to where
fd 2 pointed before (ipykernel's pipe or the terminal: the user sees exactly what they saw before)
and keeps a bounded copy. A notebook's tee stays on between cells (``hold``): the driver prints an
assert's lines at whichever driver call first meets the error, in whatever thread makes it, and
that is often between cells (seen on an H100: a kernel launched in one cell, ``.item()`` two cells
on, and the lines printed by the stream query the cell tracker's worker makes after the cell in
between, where a tee given back after each cell never saw them). A redirector that moves fd 2
between our cells (its hook runs before ours, or the user's ``dup2``) turns the hold off: from
then on each cell swaps fd 2 in and out, and gives it back only while it still points at us.

Why a process and not a thread: a reader thread needs the GIL, and C code that writes more than a
pipe's buffer to fd 2 while holding the GIL (a ``PyDLL`` call, an extension that does not release
it) would wait for a reader that waits for the GIL: the process hangs. The child has its own
interpreter; it needs nothing from this one. wurlitzer was considered and not taken: its reader is
a thread of this process (the same deadlock, only made rarer by a larger pipe), and it hands text
to file objects instead of forwarding bytes to the saved descriptor.

Commands travel in the same pipe, after the bytes they concern (a pipe is first in, first out):
"clear" after a successful cell (older lines never decide a later error), "report" when a cell
failed. The child answers a report by writing its copy to a private unlinked file and a one-line
notice to a reply pipe; the caller waits for the notice at most ``timeout`` seconds. Nothing here
blocks without a time limit: a command that cannot be written at once is dropped. A "clear" is
sent only if fd 2 received anything since the last one (a counter the child keeps in that file,
and the bytes still in the pipe): waking the child after every cell cost more than the rest of the
extension.

The child's death (the OOM killer, a stray ``kill``) must never break the user's cell: with no
reader left, a write to fd 2 fails (``EPIPE``) and a ``subprocess.run`` that writes to stderr dies
of ``SIGPIPE``. So this process keeps the pipe's read end open too (a write never finds the pipe
without a reader; the bytes wait in the pipe, enlarged to 1 MiB where Linux allows), and a thread
that waits for the child's exit starts a new child on the same pipe at once: it forwards and keeps
what waited, in order. Only the dead child's kept copy is lost (it was shown). A child that ends as
soon as it starts is replaced after a pause that doubles, a few times at most; where no child can be
started or none stays up, the tee gives up with one line on the user's stderr: fd 2 is given back to
where it pointed before and the thread forwards what is left in the pipe. The one case left: C code
that holds the GIL and writes more than the pipe holds to fd 2 in the few milliseconds before the
new child reads would wait for the thread, which waits for the GIL.
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import subprocess
import sys
import tempfile
import threading
import time

if sys.platform != "win32":  # the tee is POSIX only: elsewhere start() says so, once
    import fcntl
    import termios

_KEEP = 256 * 1024  # bytes kept: hundreds of thread lines fit, a runaway log does not
DRAIN_TIMEOUT_S = 2.0
_PIPE_SIZE = 1 << 20  # Linux's default pipe-max-size: what waits while a dead child is replaced
# A child that ends within _QUICK_DEATH_S of its start is replaced after a pause (0.05 s, doubled
# each time: 1.55 s in all), at most _RESPAWNS times in a row; then the tee gives up. Without
# this a child that could never run was replaced in a tight loop (378 processes in 3 s), forever.
_QUICK_DEATH_S = 1.0
_RESPAWN_PAUSE_S = 0.05
_RESPAWNS = 5

# The child: standard library only, started with -I -S (no site, no user paths: ~10 ms).
# fd 0: our pipe; fd 1: where fd 2 pointed; then the reply pipe and the shared report file.
_CHILD = r"""
import array, fcntl, os, select, signal, sys, termios
signal.signal(signal.SIGINT, signal.SIG_IGN)
keep, token = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
reply, store = int(sys.argv[3]), int(sys.argv[4])
fold = sys.argv[5:8]  # [sys.path entry, module, command]: fold repeated device assert lines
size = len(token) + 9
buffer, carry, forward = bytearray(), b"", True
held, sites, folded, folder = b"", set(), 0, None

# The store file's first 16 bytes: how many bytes were taken from the pipe, announced *before*
# they are read; and where in the stream the last clear command ended. Equal, with an empty
# pipe: nothing was written since the last clear. A child started after another died goes on
# counting where it stopped.
received = int.from_bytes(os.pread(store, 8, 0), "little")

def write(data):
    global forward
    view = memoryview(data)
    while forward and view:
        try:
            view = view[os.write(1, view):]
        except InterruptedError:
            continue
        except OSError:
            forward = False  # the user's stream went away: keep our copy regardless

def load_folder():
    global folder, fold
    try:
        sys.path.insert(0, fold[0])
        import importlib
        folder = importlib.import_module(fold[1])
    except Exception:
        fold = []  # forward everything as it came

def line_out(line):
    global folded
    if b"ssert" in line and fold:
        if folder is None:
            load_folder()
        found = None
        if folder is not None:
            try:
                found = folder.site(line.decode("utf-8", "replace"))
            except Exception:
                found = None
        if found is not None:
            key, cause = found
            if key in sites:
                folded += 1
                return
            if not sites:
                write(folder.verdict(cause, fold[2]).encode() + b"\n")
            sites.add(key)
            write(line)
            return
    flush_folded()
    write(line)

def flush_folded():
    global folded
    if folded and folder is not None:
        write(folder.folded(folded).encode() + b"\n")
    folded = 0

def flush_held():
    global held
    data, held = held, b""
    if data:
        line_out(data)
    flush_folded()

def end_burst():
    flush_held()
    sites.clear()

def emit(data):
    global held
    if not data:
        return
    buffer.extend(data)
    if len(buffer) > keep:
        del buffer[: len(buffer) - keep]
    if not fold:
        write(data)
        return
    # Whole lines only, so that a line split between two reads is still recognised; a partial
    # line waits for its end or a moment of silence (the select below).
    data = held + data
    end = data.rfind(b"\n") + 1
    held = data[end:]
    for line in data[:end].splitlines(keepends=True):
        line_out(line)
    if len(held) > 65536:
        flush_held()

def report(seq):
    os.ftruncate(store, 4096)
    os.pwrite(store, bytes(buffer), 4096)
    try:
        os.write(reply, b"%s %d\n" % (seq, len(buffer)))
    except OSError:
        pass

os.set_blocking(reply, False)  # a caller that gave up never blocks the forwarding
unread = array.array("i", [0])
while True:
    if not select.select([0], [], [], 0.05 if (held or folded) else None)[0]:
        flush_held()  # silence: the partial line goes on, and the count of what was folded
        continue
    fcntl.ioctl(0, termios.FIONREAD, unread)
    if not unread[0]:
        break  # readable and empty: every writer is gone
    received += unread[0]
    os.pwrite(store, received.to_bytes(8, "little"), 0)
    chunk = os.read(0, unread[0])
    if not chunk:
        break
    data, carry = carry + chunk, b""
    while data:
        at = data.find(token)
        if at < 0:
            for n in range(min(len(token) - 1, len(data)), 0, -1):
                if token.startswith(data[-n:]):
                    data, carry = data[:-n], data[-n:]
                    break
            emit(data)
            break
        if len(data) < at + size:
            emit(data[:at])
            carry = data[at:]
            break
        emit(data[:at])
        op, seq = data[at + len(token) : at + len(token) + 1], data[at + len(token) + 1 : at + size]
        data = data[at + size :]
        end_burst()  # a command ends a cell: the next cell's first assert gets its verdict
        if op == b"C":
            buffer.clear()
            os.pwrite(store, (received - len(data) - len(carry)).to_bytes(8, "little"), 8)
        elif op == b"R":
            report(seq)
if carry:
    emit(carry)
end_burst()
"""


def _forward_until_closed(read_end: int, target: int) -> None:
    """Copy a pipe to ``target`` until every writer is gone, then close both."""
    try:
        while True:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(target, view) :]
    except OSError:
        pass
    finally:
        os.close(read_end)
        os.close(target)


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class FdTee:
    """Copy everything written to ``fd`` during a cell (with ``hold``, between cells too) to
    where it went before, and keep the tail of it since the last ``clear()``.

    One pipe and one child process live as long as the tee (a process per cell would cost more
    than the rest of the extension); each cell only swaps ``fd`` in and out with ``dup2``, or,
    held, checks that it still points at the pipe. A child that dies is replaced at once by a
    thread that waits for it (see the module's doc).
    """

    def __init__(
        self, fd: int = 2, keep: int = _KEEP, fold: tuple[str, ...] = (), *, hold: bool = False
    ) -> None:
        self.fd = fd
        self.keep = keep
        # (a sys.path entry, a module, the restart command): the child imports the module on the
        # first possible assert line and forwards each site's first line only, under one verdict
        # line, and a count for the rest (diagnosis/folding.py has the contract). Its kept copy
        # is complete either way.
        self.fold = fold
        self.python = sys.executable  # the child's interpreter
        self._depth = 0  # nested cells (a cell magic running shell.run_cell) share one tee
        self._saved: int | None = None  # where ``fd`` pointed before the current cell
        self._forward: int | None = None  # our copy of the child's target, to compare and restore
        self._write_end: int | None = None
        self._read_end: int | None = None  # kept open here: the pipe never lacks a reader
        self._reply: int | None = None
        self._reply_write: int | None = None  # kept for the next child, should this one die
        self._store: int | None = None
        self._child: subprocess.Popen[bytes] | None = None
        # The watcher thread and the cells both change the child: one at a time.
        self._lock = threading.Lock()
        # Identities (device, inode) of our pipe and of the child's target: one fstat per swap.
        self._pipe_id: tuple[int, int] | None = None
        self._forward_id: tuple[int, int] | None = None
        self._token = b"\x00nb_cudaguard:" + os.urandom(8).hex().encode() + b"\x00"
        self._seq = 0
        self._quick_deaths = 0  # children in a row that ended within _QUICK_DEATH_S
        self._gave_up = False  # no child would run: the tee stays off (its one line was said)
        # Between cells too (see the module's doc): the outermost stop leaves ``fd`` on our pipe
        # (``_held``) while it points there; the next start checks it still does (one fstat).
        self.hold = hold
        self._held = False

    @property
    def active(self) -> bool:
        return self._saved is not None

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def child_pid(self) -> int | None:
        """The process id of the child copying the bytes, if one runs."""
        child = self._child
        return None if child is None else child.pid

    # --- the child -------------------------------------------------------------------------
    def _spawn(self, target: int) -> None:
        """A new pipe and child that forwards to ``target`` (the old one ends at its pipe's end)."""
        self._release_child()
        read_end, write_end = os.pipe()
        reply_read, reply_write = os.pipe()
        if sys.platform == "linux":
            with contextlib.suppress(OSError):  # a lower pipe-max-size: the default 64 KiB
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        with self._lock:
            self._read_end, self._write_end = read_end, write_end
            self._reply, self._reply_write = reply_read, reply_write
            self._forward = os.dup(target)
            try:
                with tempfile.TemporaryFile(prefix="nb_cudaguard-") as store:
                    self._store = os.dup(store.fileno())
                self._launch()
            except BaseException:
                self._close_fds()
                raise
            self._pipe_id, self._forward_id = _identity(write_end), _identity(target)

    def _launch(self) -> None:
        """Start a child on the current pipe, store and target, and a thread that waits for it.
        Called with the lock held."""
        assert self._read_end is not None and self._reply_write is not None
        assert self._store is not None and self._forward is not None
        child = subprocess.Popen(
            [
                self.python,
                *("-I", "-S", "-c", _CHILD),
                *(str(self.keep), self._token.hex(), str(self._reply_write), str(self._store)),
                *self.fold,
            ],
            stdin=self._read_end,
            stdout=self._forward,
            stderr=subprocess.DEVNULL,
            pass_fds=(self._reply_write, self._store),
            close_fds=True,
            # Its own session: a terminal's Ctrl-C (SIGINT to the foreground group) and
            # the notebook's interrupt never reach it.
            start_new_session=True,
        )
        self._child = child
        threading.Thread(
            target=self._watch, args=(child,), name="nb_cudaguard-tee-watch", daemon=True
        ).start()

    def _watch(self, child: subprocess.Popen[bytes]) -> None:
        """Wait for ``child`` to end; if it was not let go on purpose, replace it. A child that
        ends as soon as it starts (a broken interpreter, a process limit) is replaced after a
        pause that doubles each time, ``_RESPAWNS`` times at most; then the tee gives up, with
        one line on the user's stderr. Meanwhile fd 2 still points at the pipe, whose read end
        this process holds: writes wait in it (1 MiB) and are forwarded by the next child or,
        once the tee gives up, by this thread."""
        born = time.monotonic()
        with contextlib.suppress(Exception):
            child.wait()
        with self._lock:
            if self._child is not child:
                return  # released, or replaced already
            self._quick_deaths = (
                self._quick_deaths + 1 if time.monotonic() - born < _QUICK_DEATH_S else 0
            )
            quick = self._quick_deaths
        why = f"it exited at once {quick} times (last exit status {child.returncode})"
        if quick <= _RESPAWNS:
            if quick:
                time.sleep(_RESPAWN_PAUSE_S * 2 ** (quick - 1))
            with self._lock:
                if self._child is not child:
                    return  # released or replaced meanwhile (a cell started a new one)
                try:
                    self._launch()
                    return
                except Exception as error:
                    why = f"it could not be started ({error})"
        with self._lock:
            if self._child is not child:
                return
            self._gave_up = True
            # No child can be started: fd 2 goes back to where it pointed, and what waits in
            # the pipe (and what subprocesses that inherited it still write) is forwarded here.
            read_end, forward, write_end = self._read_end, self._forward, self._write_end
            with contextlib.suppress(OSError):
                if forward is not None and _identity(self.fd) == self._pipe_id:
                    os.dup2(forward, self.fd)
            self._read_end = self._forward = self._write_end = None
            self._child = None
            self._close_fds()
        if write_end is not None:
            os.close(write_end)
        if read_end is not None and forward is not None:
            with contextlib.suppress(OSError):
                os.write(
                    forward,
                    f"nb_cudaguard: stopped copying fd {self.fd} for the CUDA error panel: the "
                    f"process that copies it {why}. Device assert lines are still shown, but "
                    "no longer captured.\n".encode(),
                )
            _forward_until_closed(read_end, forward)

    def _close_fds(self) -> None:
        self._pipe_id = self._forward_id = None
        for name in ("_write_end", "_read_end", "_reply", "_reply_write", "_store", "_forward"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)

    def _release_child(self) -> None:
        with self._lock:
            child, self._child = self._child, None
            self._close_fds()
        if child is not None:
            # It ends by itself once no writer of the pipe is left; it is never killed, which
            # could lose bytes the user has not seen yet.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.5)

    # --- per cell --------------------------------------------------------------------------
    def start(self) -> None:
        self._depth += 1
        if self._saved is not None:
            if self._held:
                self._held = False
                if _identity(self.fd) != self._pipe_id:
                    # Moved since our last cell (a redirector whose hook runs before ours, or
                    # the user's dup2): its restore point is our pipe, which stays as it is;
                    # this cell goes to it, and our stop gives ``fd`` back once it is ours.
                    self.hold = False
            return
        try:
            self._start()
        except BaseException:
            self._depth -= 1
            raise

    def _start(self) -> None:
        if sys.platform == "win32":
            raise OSError("the fd 2 tee is not available on Windows")
        if self._gave_up:
            return  # inactive: stop() finds nothing to give back
        alive = self._child is not None and self._child.poll() is None
        saved = os.dup(self.fd)
        now = _identity(saved)
        if alive and now == self._pipe_id and self._forward is not None:
            # Another redirector that started inside our last cell restored fd 2 to our pipe:
            # the child already forwards where fd 2 really goes.
            os.close(saved)
            saved = os.dup(self._forward)
        elif not alive or now != self._forward_id:
            try:
                self._spawn(saved)  # fd 2 goes somewhere new (or the child is gone)
            except BaseException:
                os.close(saved)
                raise
        with self._lock:
            if self._write_end is None:  # the child died just now and none could replace it
                os.close(saved)
                raise OSError("the fd 2 tee's child could not be started")
            self._saved = saved
            os.dup2(self._write_end, self.fd)

    def stop(self) -> None:
        """Give ``fd`` back (the outermost cell's stop only), or, with ``hold``, leave it on our
        pipe until the next cell while it still points there. Every byte written before is
        forwarded by the child in order; nothing here waits for it."""
        if self._depth > 0:
            self._depth -= 1
        if self._depth > 0 or self._saved is None:
            return
        if self.hold and self._pipe_id is not None and _identity(self.fd) == self._pipe_id:
            self._held = True
            return
        saved, self._saved = self._saved, None
        try:
            # Other redirectors (wurlitzer, a capture magic) may not nest with ours: give ``fd``
            # back only if it still points at our pipe, never undo someone else's change.
            if self._pipe_id is not None and _identity(self.fd) == self._pipe_id:
                os.dup2(saved, self.fd)
        finally:
            os.close(saved)

    def _command(self, op: bytes, timeout: float) -> bytes | None:
        """Send a command after everything written so far; None if it cannot go within
        ``timeout`` (the child is stuck, or gone with no successor). A command sent while a
        dead child is being replaced waits in the pipe for the new one."""
        if self._write_end is None:
            return None
        self._seq = (self._seq + 1) % 10**8
        seq = b"%08d" % self._seq
        _, writable, _ = select.select([], [self._write_end], [], timeout)
        if not writable:
            return None
        try:
            # Shorter than PIPE_BUF: written whole or not at all, never interleaved.
            os.write(self._write_end, self._token + op + seq)
        except OSError:
            return None
        return seq

    def received(self) -> bool:
        """Whether ``fd`` received anything since the last ``clear()`` (no round trip)."""
        if self._store is None or self._write_end is None or sys.platform == "win32":
            return False
        try:
            counters = os.pread(self._store, 16, 0)  # bytes received; the same at the last clear
            unread = array.array("i", [0])
            fcntl.ioctl(self._write_end, termios.FIONREAD, unread)  # bytes not read yet
        except OSError:
            return True
        return counters[:8] != counters[8:16] or bool(unread[0])

    def clear(self) -> None:
        """Forget what was captured so far."""
        if self.received():
            self._command(b"C", 0)

    def text(self, timeout: float = DRAIN_TIMEOUT_S) -> str:
        """What was captured since the last ``clear()`` (its tail): every byte written before
        this call, or "" if the child does not answer within ``timeout``."""
        deadline = time.monotonic() + timeout
        reply, store = self._reply, self._store
        seq = self._command(b"R", timeout)
        if seq is None or reply is None or store is None:
            return ""
        pending = b""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return ""
                ready, _, _ = select.select([reply], [], [], left)
                if not ready:
                    return ""
                chunk = os.read(reply, 4096)
                if not chunk:
                    return ""
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    got, _, size = line.partition(b" ")
                    if got == seq:  # earlier answers (a timed-out report) are skipped
                        data = os.pread(store, int(size), 4096)
                        return data.decode("utf-8", errors="replace")
        except (OSError, ValueError):  # closed by the watcher: no child could be started
            return ""

    def close(self) -> None:
        """Give ``fd`` back and let the child go (it ends once no process holds the pipe)."""
        self._depth = min(self._depth, 1)
        self.hold = False
        try:
            self.stop()
        finally:
            self._depth = 0
            self._release_child()
