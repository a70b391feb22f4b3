"""Killable worker processes: the only place kernel code (hostile) is loaded and run.

A `WorkerPool` keeps `size` worker processes. `pool.run(task, timeout_s, mem_limit_bytes)` sends a
task (a module-level function named "module:function" plus pickled args) to a free worker and
returns a `WorkerOutcome` whatever the task does:

  ok       the task returned a JSON-safe value
  error    the task raised; the worker is fine (unless the error poisoned CUDA, see below)
  crashed  the worker died (signal, exit(), abort) or broke the sandbox (created processes,
           corrupted the reply pipe)
  timeout  no reply within timeout_s: the worker's process tree is killed
  oom      the worker's process tree went over mem_limit_bytes of host RSS: killed

After anything but ok/error the worker is replaced by a fresh one, so one hostile kernel costs
one verdict. A task that detects a sticky CUDA error (illegal address, misaligned access: the
context is unusable) calls `mark_poisoned(reason)` (or raises an exception mentioning CUDA);
the worker sends its reply and exits, and the next task gets a fresh worker.

Why it is built this way:
- subprocess, not multiprocessing: we own the fds, the process group and the environment.
- The worker's reply is JSON, never pickle: unpickling bytes from a hostile process would run
  its code in the harness.
- The worker's stdout/stderr are a pipe the parent drains into a bounded ring (crash messages
  for the verdict, no disk or memory blow-up); the protocol uses two other fds, closed on exec.
- Each worker is two processes: a small trusted "nanny" that is a child subreaper (prctl) and
  the worker it forks. A kernel that double-forks, calls setsid, or forks and then exits the
  worker is still the nanny's descendant: found and killed, never an escaped process. When the
  worker dies the nanny kills what is left and exits with the worker's status.
- Processes are read from /proc (Linux), no extra dependency.
- Host memory is watched by the parent (RSS of the whole tree). RLIMIT_AS is never set:
  CUDA reserves huge virtual ranges and would fail to initialise. For CPU-only tasks (loading a
  library, reading its meta) `rlimit_data=True` also sets RLIMIT_DATA in the child.
"""
from __future__ import annotations

import collections
import importlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

OK, ERROR, CRASHED, TIMEOUT, OOM = "ok", "error", "crashed", "timeout", "oom"
OUTCOME_STATUSES = (OK, ERROR, CRASHED, TIMEOUT, OOM)

DEFAULT_MEM_LIMIT = 16 << 30           # host RSS of one worker tree (CUDA context + torch fit)
DEFAULT_BOOT_TIMEOUT = 120.0           # python + imports on a loaded 2-core machine
MAX_REPLY_BYTES = 64 << 20             # a reply larger than this is a sandbox violation
_POLL_S = 0.02                         # RSS / liveness poll period while a task runs
_RING_BYTES = 16 << 10                 # how much of the worker's output we keep for verdicts
_HDR = struct.Struct("<Q")
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerError(RuntimeError):
    """The pool itself could not work (worker would not start): not a verdict on a kernel."""


@dataclass(frozen=True)
class Task:
    """What a worker runs: fn(*args, **kwargs), fn given as 'package.module:function'."""
    fn: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, fn: "str | Callable", *args, **kwargs) -> "Task":
        if callable(fn):
            mod, name = fn.__module__, fn.__qualname__
            if mod == "__main__" or "<" in name:
                raise ValueError(f"task function {name!r} must be a module-level function "
                                 "importable in a fresh process")
            fn = f"{mod}:{name}"
        if not isinstance(fn, str) or ":" not in fn:
            raise ValueError(f"task function must be 'module:function', got {fn!r}")
        return cls(fn, tuple(args), dict(kwargs))


@dataclass
class WorkerOutcome:
    status: str                  # ok | error | crashed | timeout | oom
    value: Any = None            # the task's return value (JSON-decoded) when ok
    detail: str = ""             # why: exception text, signal name, exit code, output tail
    poisoned: bool = False       # the worker reported its CUDA context unusable and exited
    seconds: float = 0.0         # wall time from sending the task to the verdict
    worker_pid: int | None = None
    output_tail: str = ""        # last bytes the worker printed (stdout+stderr)

    @property
    def ok(self) -> bool:
        return self.status == OK


# --------------------------------------------------------------------------- parent side

def _send_frame(fd: int, payload: bytes) -> None:
    data = _HDR.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Ring:
    """Drains a pipe in a thread, keeping the last `cap` bytes."""

    def __init__(self, fd: int, cap: int = _RING_BYTES):
        self._fd, self._cap = fd, cap
        self._buf = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True, name="cudal2-worker-out")
        self._thread.start()

    def _drain(self):
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self._lock:
                self._buf.append(chunk)
                self._size += len(chunk)
                while self._size - len(self._buf[0]) >= self._cap:
                    self._size -= len(self._buf.popleft())
        try:
            os.close(self._fd)
        except OSError:
            pass

    def tail(self, n: int = 2000, wait: float = 0.0) -> str:
        if wait:
            self._thread.join(wait)
        with self._lock:
            data = b"".join(self._buf)[-n:]
        return data.decode("utf-8", "replace")


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_table() -> dict[int, tuple[int, int]]:
    """{pid: (ppid, rss_bytes)} for every process, from /proc/<pid>/stat."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            rest = data[data.rindex(b")") + 2:].split()   # comm may hold spaces and ')'
            table[int(name)] = (int(rest[1]), int(rest[21]) * _PAGE)   # fields 4 (ppid), 24 (rss)
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(pid: int, table: dict | None = None) -> list[int]:
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        children.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _signal_all(pids, sig) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


class _Worker:
    """One worker process, seen from the parent."""

    def __init__(self, env: dict[str, str], rlimit_data: bool, preload: tuple[str, ...] = ()):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        out_r, out_w = os.pipe()
        # The worker registers a bare `cudal2` package (no __init__: that imports torch and
        # dispatch) so a worker boots in ~0.1 s; tasks import the submodules they need.
        code = ("import sys, types; sys.path.insert(0, sys.argv[1]); "
                "pkg = types.ModuleType('cudal2'); pkg.__path__ = [sys.argv[1] + '/cudal2']; "
                "pkg.__file__ = sys.argv[1] + '/cudal2/__init__.py'; sys.modules['cudal2'] = pkg; "
                "from cudal2.harness.worker import _worker_main; _worker_main()")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, _REPO_ROOT, str(to_child_r), str(from_child_w),
                 "1" if rlimit_data else "0", json.dumps(list(preload))],
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                pass_fds=(to_child_r, from_child_w), env=env, start_new_session=True)
        finally:
            for fd in (to_child_r, from_child_w, out_w):
                os.close(fd)
        self.pid = self.proc.pid          # the nanny; the worker's pid comes in its hello
        self.worker_pid = self.pid
        self._w, self._r = to_child_w, from_child_r
        self.out = _Ring(out_r)
        self.ready = False
        self.tasks_done = 0
        self._rbuf = b""

    # Reading frames with a deadline; returns bytes, or a str naming the failure.
    def _read_frame(self, deadline: float, mem_limit: int | None) -> "bytes | tuple[str, str]":
        need = None
        next_check = 0.0
        start = time.monotonic()
        while True:
            if need is None and len(self._rbuf) >= _HDR.size:
                (need,) = _HDR.unpack(self._rbuf[:_HDR.size])
                if need > MAX_REPLY_BYTES:
                    return (CRASHED, f"sandbox violation: reply of {need} bytes on the protocol pipe")
            if need is not None and len(self._rbuf) >= _HDR.size + need:
                frame = self._rbuf[_HDR.size:_HDR.size + need]
                self._rbuf = self._rbuf[_HDR.size + need:]
                return frame
            now = time.monotonic()
            if now >= deadline:
                return (TIMEOUT, "")
            if mem_limit and now >= next_check:
                # fast polls while a blow-up is likeliest (loading), then cheaper ones
                next_check = now + (_POLL_S if now - start < 2.0 else 5 * _POLL_S)
                rss = self.tree_rss()
                if rss > mem_limit:
                    return (OOM, f"host RSS {rss >> 20} MiB > limit {mem_limit >> 20} MiB")
            r, _, _ = select.select([self._r], [], [], min(_POLL_S, max(0.0, deadline - now)))
            if r:
                try:
                    chunk = os.read(self._r, 1 << 20)
                except OSError:
                    chunk = b""
                if not chunk:
                    return (CRASHED, self._death_detail())
                self._rbuf += chunk

    def tree_rss(self) -> int:
        table = _proc_table()
        return sum(table.get(p, (0, 0))[1] for p in [self.pid, *_descendants(self.pid, table)])

    def _death_detail(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "worker closed its reply pipe but is still running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"worker killed by {name}"
        return f"worker exited with code {rc}"

    def boot(self, timeout: float) -> None:
        frame = self._read_frame(time.monotonic() + timeout, None)
        if isinstance(frame, tuple):
            self.kill()
            raise WorkerError(f"worker did not start ({frame[0]}: {frame[1]}); output:\n"
                              f"{self.out.tail(wait=1.0)}")
        hello = json.loads(frame)
        if not isinstance(hello.get("pid"), int) or hello["pid"] not in _descendants(self.pid):
            self.kill()
            raise WorkerError(f"worker sent a bad hello: {hello!r}")
        self.worker_pid = hello["pid"]
        self.ready = True

    def run(self, task: Task, timeout_s: float, mem_limit: int | None) -> WorkerOutcome:
        t0 = time.monotonic()
        # The nonce makes a reply forged by kernel code (writing to the pipe) hard to pass off.
        nonce = os.urandom(16).hex()
        payload = pickle.dumps({"fn": task.fn, "args": task.args, "kwargs": task.kwargs,
                                "mem_limit": mem_limit, "nonce": nonce})
        try:
            _send_frame(self._w, payload)
        except OSError as e:
            return WorkerOutcome(CRASHED, detail=f"worker gone before the task ({e}); "
                                 + self._death_detail(), worker_pid=self.worker_pid)
        frame = self._read_frame(t0 + timeout_s, mem_limit)
        secs = time.monotonic() - t0
        if isinstance(frame, tuple):
            status, detail = frame
            if status == TIMEOUT:
                detail = f"no reply within {timeout_s:g} s"
            return WorkerOutcome(status, detail=detail, seconds=secs, worker_pid=self.worker_pid)
        try:
            reply = json.loads(frame)
            if not isinstance(reply, dict) or reply.get("pid") != self.worker_pid \
                    or reply.get("nonce") != nonce:
                raise ValueError(f"reply from pid {reply.get('pid') if isinstance(reply, dict) else '?'}")
        except (ValueError, UnicodeDecodeError) as e:
            return WorkerOutcome(CRASHED, detail=f"sandbox violation: corrupt reply ({e})",
                                 seconds=secs, worker_pid=self.worker_pid)
        kids = [p for p in _descendants(self.pid) if p != self.worker_pid]
        if kids:
            return WorkerOutcome(CRASHED, detail="sandbox violation: the task created processes "
                                 f"(pids {kids[:8]})", seconds=secs,
                                 worker_pid=self.worker_pid)
        self.tasks_done += 1
        status = OK if reply.get("ok") else ERROR
        return WorkerOutcome(status, value=reply.get("value"), detail=str(reply.get("detail", "")),
                             poisoned=bool(reply.get("poisoned")), seconds=secs,
                             worker_pid=self.worker_pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Stop the whole tree: freeze descendants first so nothing forks past us."""
        for _ in range(3):
            kids = _descendants(self.pid)
            _signal_all(kids, signal.SIGSTOP)
            if not kids:
                break
        victims = _descendants(self.pid)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _signal_all(victims, signal.SIGKILL)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._w = self._r = -1

    def close(self) -> None:
        """Polite stop (empty frame = exit), then kill."""
        if self.alive() and self._w >= 0:
            try:
                _send_frame(self._w, b"")
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class WorkerPool:
    """`size` killable worker processes; one task per worker at a time; thread-safe.

    device: if given, the workers see only that GPU (CUDA_VISIBLE_DEVICES).
    max_tasks: recycle a worker after this many tasks (loaded .so files are never unloaded,
      and a kernel's static code ran in that process: fresh processes bound both).
    rlimit_data: set RLIMIT_DATA to the task's memory limit in the child (CPU-only tasks only).
    preload: modules ("torch") or no-argument functions ("pkg.mod:fn") the worker imports/calls
      while booting, so their cost counts against boot_timeout_s and not a task's time limit.
    spare: keep this many extra workers booting/booted in the background, so a task after a
      recycled worker (max_tasks=1: a fresh process per task) does not wait for the boot.
    started: workers spawned so far (spares included): what the pool's boots cost a caller.
    """

    def __init__(self, size: int = 1, *, device: int | str | None = None,
                 env: dict[str, str] | None = None, mem_limit_bytes: int = DEFAULT_MEM_LIMIT,
                 max_tasks: int = 50, boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT,
                 rlimit_data: bool = False, preload: tuple[str, ...] = (), spare: int = 0):
        if size < 1:
            raise ValueError(f"WorkerPool size must be >= 1, got {size!r}")
        self.size = size
        self.mem_limit_bytes = mem_limit_bytes
        self.max_tasks = max_tasks
        self.boot_timeout_s = boot_timeout_s
        self.rlimit_data = rlimit_data
        self.preload = tuple(preload)
        self._env = dict(os.environ if env is None else env)
        self._env["PYTHONUNBUFFERED"] = "1"
        self._env["PYTHONPATH"] = os.pathsep.join(
            [_REPO_ROOT] + [p for p in self._env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if device is not None:
            self._env["CUDA_VISIBLE_DEVICES"] = str(device)
        self._free: list[_Worker] = []
        self._cv = threading.Condition()
        self._busy = 0
        self._closed = False
        self.restarts = 0            # workers replaced after a crash/timeout/oom/poison
        self.started = 0             # workers spawned (the first, spares, replacements)
        self.spare = max(0, int(spare))
        self._booting = 0
        self._top_up()

    def _top_up(self) -> None:
        """Boot spare workers in background threads until `spare` are idle or booting."""
        with self._cv:
            need = self.spare - self._booting - len(self._free)
            if self._closed or need <= 0:
                return
            self._booting += need
        for _ in range(need):
            threading.Thread(target=self._boot_spare, daemon=True, name="cudal2-spare").start()

    def _boot_spare(self) -> None:
        w = None
        try:
            w = self._spawn()
            w.boot(self.boot_timeout_s)
        except Exception:  # noqa: BLE001 - a spare that fails to boot is simply not there
            if w is not None:
                w.kill()
            w = None
        with self._cv:
            self._booting -= 1
            if w is not None and not self._closed:
                self._free.append(w)
                w = None
            self._cv.notify_all()
        if w is not None:
            w.close()

    def _spawn(self) -> _Worker:
        with self._cv:
            self.started += 1
        return _Worker(self._env, self.rlimit_data, self.preload)

    def _acquire(self) -> _Worker:
        with self._cv:
            while True:
                if self._closed:
                    raise WorkerError("WorkerPool is closed")
                if self._free:
                    self._busy += 1
                    return self._free.pop()
                if self._busy < self.size and not self._booting:
                    self._busy += 1
                    break
                self._cv.wait()        # a worker is busy, or a spare is about to be ready
        try:
            return self._spawn()
        except BaseException:
            with self._cv:
                self._busy -= 1
                self._cv.notify()
            raise

    def _release(self, w: _Worker | None) -> None:
        with self._cv:
            self._busy -= 1
            if w is not None and not self._closed:
                self._free.append(w)
            self._cv.notify()
        if w is not None and self._closed:
            w.close()

    def run(self, task: "Task | str | Callable", *args, timeout_s: float = 60.0,
            mem_limit_bytes: int | None = None,
            keep_if: "Callable[[WorkerOutcome], bool] | None" = None, **kwargs) -> WorkerOutcome:
        """Run task(*args, **kwargs) in a worker. Never raises for anything the task does.
        keep_if: the worker takes another task (max_tasks allowing) only if keep_if(outcome) is
        true; otherwise it is recycled like one past max_tasks (a finals worker whose session
        had a candidate fail: the next session gets a fresh process)."""
        if not isinstance(task, Task):
            task = Task.of(task, *args, **kwargs)
        elif args or kwargs:
            raise TypeError("pass arguments inside the Task, or a function plus arguments")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        mem = self.mem_limit_bytes if mem_limit_bytes is None else mem_limit_bytes
        w = self._acquire()
        keep = recycle = False
        try:
            if not w.ready:
                w.boot(self.boot_timeout_s)      # boot time is not the task's time
            out = w.run(task, timeout_s, mem)
            out.output_tail = w.out.tail(wait=0.2 if out.status not in (OK, ERROR) else 0.0)
            if out.status == CRASHED and out.output_tail.strip():
                out.detail += "; output: " + out.output_tail.strip().splitlines()[-1][-300:]
            clean = out.status in (OK, ERROR) and not out.poisoned and w.alive()
            keep = clean and w.tasks_done < self.max_tasks and _keeps(keep_if, out)
            recycle = clean and not keep
            if not clean:
                self.restarts += 1
            return out
        finally:
            if keep:
                self._release(w)
            else:
                w.close() if recycle else w.kill()
                self._release(None)
                self._top_up()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            free, self._free = self._free, []
        for w in free:
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _keeps(keep_if, out: WorkerOutcome) -> bool:
    """The caller's keep_if on an outcome; a predicate that raises keeps nothing (a fresh
    worker is the safe side), and run() still never raises."""
    if keep_if is None:
        return True
    try:
        return bool(keep_if(out))
    except Exception:  # noqa: BLE001 - the caller's bug must not cost the verdict
        return False


# --------------------------------------------------------------------------- child side

_poison_reason: str | None = None


def mark_poisoned(reason: str) -> None:
    """Called by a task inside the worker when its CUDA context is unusable (sticky error):
    the worker replies, then exits, and the pool starts a fresh one for the next task."""
    global _poison_reason
    _poison_reason = reason or "poisoned"


def _looks_like_cuda_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA" in text or "cuda" in type(exc).__name__.lower() or "AcceleratorError" in text


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _set_subreaper() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)        # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass                              # not Linux: process-group kill still applies


def _nanny(worker: int, fds: tuple[int, ...]) -> None:
    """Trusted half of a worker: wait for the worker, then kill every process it left behind
    (orphans are re-parented to us, the subreaper) and exit with the worker's status."""
    for fd in fds:                        # the parent must see EOF when the worker dies
        os.close(fd)
    _, status = os.waitpid(worker, 0)
    for _ in range(100):
        kids = _descendants(os.getpid())
        if not kids:
            break
        _signal_all(kids, signal.SIGKILL)
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.01)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)         # same verdict for the parent: "killed by SIGSEGV"
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _worker_main() -> None:
    r_fd, w_fd, rlimit_data = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    os.set_inheritable(r_fd, False)       # a kernel that execs cannot inherit the protocol
    os.set_inheritable(w_fd, False)
    # SIGINT from the user's terminal goes to the parent; it decides when workers die.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:                                  # a crashing kernel leaves no core files around
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    _set_subreaper()
    child = os.fork()
    if child:
        _nanny(child, (r_fd, w_fd))
    for name in json.loads(sys.argv[5]):
        mod, _, fn = name.partition(":")
        obj = importlib.import_module(mod)
        if fn:
            getattr(obj, fn)()
    me = os.getpid()
    _send_frame(w_fd, json.dumps({"pid": me}).encode())
    while True:
        hdr = _read_exact(r_fd, _HDR.size)
        if hdr is None:
            return
        (n,) = _HDR.unpack(hdr)
        if n == 0:
            return
        req = pickle.loads(_read_exact(r_fd, n) or b"")
        if rlimit_data and req.get("mem_limit"):
            import resource
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            lim = req["mem_limit"] if hard == resource.RLIM_INFINITY else min(req["mem_limit"], hard)
            resource.setrlimit(resource.RLIMIT_DATA, (lim, hard))
        global _poison_reason
        _poison_reason = None
        reply: dict[str, Any] = {"pid": me, "nonce": req.get("nonce")}
        try:
            mod, name = req["fn"].split(":", 1)
            fn: Any = importlib.import_module(mod)
            for part in name.split("."):
                fn = getattr(fn, part)
            value = fn(*req["args"], **req["kwargs"])
            reply.update(ok=True, value=value)
        except BaseException as e:          # the task's failure is a verdict, not our crash
            if isinstance(e, KeyboardInterrupt):
                raise
            reply.update(ok=False, detail=f"{type(e).__name__}: {e}"[:4000])
            if _looks_like_cuda_error(e):
                mark_poisoned(reply["detail"])
        if os.getpid() != me:               # a forked copy of us must not answer
            os._exit(0)
        if _poison_reason:
            reply["poisoned"] = True
            reply.setdefault("detail", _poison_reason)
        try:
            data = json.dumps(reply, allow_nan=True, default=repr).encode()
        except (TypeError, ValueError) as e:
            data = json.dumps({"pid": me, "nonce": req.get("nonce"), "ok": False,
                               "detail": f"task returned a value that is not JSON: {e}"}).encode()
        _send_frame(w_fd, data)
        if _poison_reason:
            os._exit(0)


# --------------------------------------------------------------------------- tasks

def probe_library(so_path: str) -> dict:
    """Worker task: load a kernel .so (static constructors run here) and read cudal2_meta().

    Returns {"meta": dict, "symbols": {...: bool}}. Raises on a missing symbol or on meta that
    is not a UTF-8 JSON object; a meta that crashes or hangs is the pool's verdict."""
    import ctypes
    lib = ctypes.CDLL(str(so_path), mode=ctypes.RTLD_LOCAL)
    symbols = {s: hasattr(lib, s) for s in ("cudal2_hgemm", "cudal2_meta", "cudal2_workspace")}
    if not symbols["cudal2_meta"]:
        raise LookupError(f"{so_path} does not export cudal2_meta")
    fn = lib.cudal2_meta
    fn.restype = ctypes.c_void_p            # raw pointer: we bound the read ourselves
    fn.argtypes = []
    ptr = fn()
    if not ptr:
        raise ValueError("cudal2_meta() returned NULL")
    raw = ctypes.string_at(ptr)             # a wild pointer segfaults here: the pool's verdict
    if len(raw) > 1 << 20:
        raise ValueError(f"cudal2_meta() returned {len(raw)} bytes (> 1 MiB)")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"cudal2_meta() is not UTF-8: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"cudal2_meta() is not JSON: {e}; starts {raw[:80]!r}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"cudal2_meta() is JSON {type(meta).__name__}, not an object")
    return {"meta": meta, "symbols": symbols}


def _selftest_sleep(seconds: float) -> float:     # used by tests: a task that hangs
    time.sleep(seconds)
    return seconds


def _selftest_echo(value: Any) -> Any:
    return value
