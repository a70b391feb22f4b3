"""The worker sandbox: every way a task can misbehave costs one verdict, and the pool keeps
working. Pure CPU: tasks are the Python functions below (imported by name in the worker);
the hostile .so files of tests/data/hostile are in test_audit.py and the compile tests here."""
import os
import signal
import time
from pathlib import Path

import pytest

from cudal2.harness.worker import Task, WorkerPool, mark_poisoned, probe_library

HOSTILE = Path(__file__).parent / "data" / "hostile"
ME = "tests.test_worker"          # how the worker imports this file (repo root on its path)


# ---- tasks (run inside the worker) -------------------------------------------------------
def _task_echo(x):
    return {"echo": x, "pid": os.getpid()}


def _task_raise():
    raise ValueError("bad input from the kernel")


def _task_cuda_error():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _task_poison():
    mark_poisoned("illegal address")
    return "reported"


def _task_hog(mb_per_step):
    chunks = []
    while True:
        chunks.append(bytearray(b"\1" * (mb_per_step << 20)))


def _task_fork_and_wait():
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    return pid


def _task_escape(pidfile):
    """Double fork + setsid: the grandchild leaves our process group and is orphaned."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    return "escaped?"


def _task_fork_then_exit(pidfile):
    """The kernel forks a detached child and exits the worker at once: the child is orphaned
    before any check can see it as the worker's descendant."""
    if os.fork() == 0:
        os.setsid()
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(600)
        os._exit(0)
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    os._exit(0)


def _task_forge_reply():
    """Kernel code writing a reply of its own to the protocol pipe (it has no nonce)."""
    import json
    import struct
    import sys
    fd = int(sys.argv[3])
    data = json.dumps({"pid": os.getpid(), "ok": True, "value": "forged"}).encode()
    os.write(fd, struct.pack("<Q", len(data)) + data)
    time.sleep(600)


def _task_spam_output():
    for _ in range(200):
        os.write(1, b"x" * 65536)
    return "done"


def _task_kill_self():
    os.kill(os.getpid(), signal.SIGSEGV)


def _task_not_json():
    return object()


def _gone(pid, within=5.0):
    """The process no longer runs (absent, or a zombie awaiting its parent)."""
    end = time.time() + within
    while time.time() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pool():
    p = WorkerPool(boot_timeout_s=120)
    yield p
    p.close()


def test_ok_and_worker_reused(pool):
    a = pool.run(f"{ME}:_task_echo", [1, "x"])
    b = pool.run(Task.of(f"{ME}:_task_echo", 2))
    assert a.status == "ok" and a.value["echo"] == [1, "x"]
    assert b.value["pid"] == a.value["pid"] == a.worker_pid     # same process, no restart
    assert pool.restarts == 0


def test_exception_is_error_and_worker_survives(pool):
    first = pool.run(f"{ME}:_task_echo", 0)
    out = pool.run(f"{ME}:_task_raise")
    assert out.status == "error" and "bad input from the kernel" in out.detail
    assert not out.poisoned
    assert pool.run(f"{ME}:_task_echo", 1).value["pid"] == first.value["pid"]


def test_timeout_kills_and_next_task_gets_fresh_worker(pool):
    out = pool.run("cudal2.harness.worker:_selftest_sleep", 60, timeout_s=1.0)
    assert out.status == "timeout" and "1 s" in out.detail
    assert _gone(out.worker_pid)
    nxt = pool.run(f"{ME}:_task_echo", 1)
    assert nxt.ok and nxt.value["pid"] != out.worker_pid
    assert pool.restarts == 1


@pytest.mark.parametrize("fn, expect", [("os:abort", "SIGABRT"), (f"{ME}:_task_kill_self", "SIGSEGV"),
                                        ("os:_exit", "code 0")])
def test_crash_is_a_verdict(pool, fn, expect):
    out = pool.run(fn, 0) if fn == "os:_exit" else pool.run(fn)
    assert out.status == "crashed" and expect in out.detail
    assert pool.run(f"{ME}:_task_echo", 1).ok


def test_memory_limit(pool):
    out = pool.run(f"{ME}:_task_hog", 16, timeout_s=60, mem_limit_bytes=200 << 20)
    assert out.status == "oom" and "limit 200 MiB" in out.detail
    assert _gone(out.worker_pid)
    assert pool.run(f"{ME}:_task_echo", 1).ok


def test_rlimit_data_for_cpu_only_tasks():
    with WorkerPool(rlimit_data=True) as p:
        out = p.run(f"{ME}:_task_hog", 16, timeout_s=60, mem_limit_bytes=300 << 20)
        # RLIMIT_DATA makes the allocation fail inside (MemoryError) before RSS polling sees it,
        # or the parent's RSS watch kills it first: either way no host blow-up, pool alive.
        assert out.status in ("error", "oom")
        if out.status == "error":
            assert "MemoryError" in out.detail
        assert p.run(f"{ME}:_task_echo", 1).ok


def test_child_process_is_a_violation_and_is_killed(pool):
    out = pool.run(f"{ME}:_task_fork_and_wait", timeout_s=30)
    assert out.status == "crashed" and "created processes" in out.detail
    assert _gone(out.worker_pid)
    assert pool.run(f"{ME}:_task_echo", 1).ok


def test_setsid_grandchild_cannot_escape(pool, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    out = pool.run(f"{ME}:_task_escape", str(pidfile), timeout_s=30)
    assert out.status == "crashed" and "created processes" in out.detail
    grandchild = int(pidfile.read_text())
    # it left the process group, but the worker is a child subreaper: found and killed
    assert _gone(grandchild)
    assert pool.run(f"{ME}:_task_echo", 1).ok


def test_fork_then_exit_cannot_escape(pool, tmp_path):
    pidfile = tmp_path / "orphan.pid"
    out = pool.run(f"{ME}:_task_fork_then_exit", str(pidfile), timeout_s=30)
    assert out.status == "crashed" and "code 0" in out.detail
    assert _gone(int(pidfile.read_text()))      # the nanny (subreaper) adopted and killed it
    assert pool.run(f"{ME}:_task_echo", 1).ok


def test_forged_reply_is_a_violation(pool):
    out = pool.run(f"{ME}:_task_forge_reply", timeout_s=30)
    assert out.status == "crashed" and "corrupt reply" in out.detail
    assert out.value is None
    assert pool.run(f"{ME}:_task_echo", 1).ok


def test_poisoned_worker_replies_then_is_replaced(pool):
    out = pool.run(f"{ME}:_task_poison")
    assert out.status == "ok" and out.value == "reported" and out.poisoned
    assert _gone(out.worker_pid)
    assert pool.run(f"{ME}:_task_echo", 1).value["pid"] != out.worker_pid


def test_cuda_exception_poisons(pool):
    out = pool.run(f"{ME}:_task_cuda_error")
    assert out.status == "error" and out.poisoned
    assert pool.run(f"{ME}:_task_echo", 1).value["pid"] != out.worker_pid


def test_output_flood_is_bounded(pool):
    out = pool.run(f"{ME}:_task_spam_output", timeout_s=60)
    assert out.ok and out.value == "done"
    assert len(out.output_tail) <= 2000


def test_reply_is_json_not_pickle(pool):
    out = pool.run(f"{ME}:_task_not_json")
    assert out.ok and isinstance(out.value, str) and "object" in out.value


def test_bad_task_names(pool):
    with pytest.raises(ValueError):
        Task.of("no_colon")
    with pytest.raises(ValueError):
        Task.of(lambda: 1)
    out = pool.run("cudal2.harness.worker:does_not_exist")
    assert out.status == "error" and "does_not_exist" in out.detail


def test_pool_of_two_runs_concurrently():
    import threading
    with WorkerPool(2) as p:
        res = []
        ts = [threading.Thread(target=lambda: res.append(
            p.run("cudal2.harness.worker:_selftest_sleep", 0.5, timeout_s=30))) for _ in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert [r.status for r in res] == ["ok", "ok"]
        assert res[0].worker_pid != res[1].worker_pid


def test_keep_if_retires_a_worker_without_counting_a_restart():
    """keep_if (the finals' session_ok): a worker whose outcome it refuses takes no more tasks;
    the next task runs in a fresh process, no restart counted (nothing faulted); a keep_if that
    raises keeps nothing and run() still answers."""
    def boom(out):
        raise KeyError("the caller's bug")

    with WorkerPool(max_tasks=64) as p:
        a = p.run(f"{ME}:_task_echo", 1, keep_if=lambda out: out.value["echo"] == 1)
        b = p.run(f"{ME}:_task_echo", 2, keep_if=lambda out: out.value["echo"] == 1)
        c = p.run(f"{ME}:_task_echo", 3, keep_if=boom)
        d = p.run(f"{ME}:_task_echo", 4)
        pids = [o.value["pid"] for o in (a, b, c, d)]
        assert all(o.ok for o in (a, b, c, d))
        assert pids[0] == pids[1] and len({pids[1], pids[2], pids[3]}) == 3
        assert _gone(pids[1]) and _gone(pids[2])
        assert (p.started, p.restarts) == (3, 0)


# ---- hostile shared libraries (need nvcc) -------------------------------------------------
def _so(name):
    from cudal2.core.build import build_file
    res = build_file(HOSTILE / name, arch="sm_90a")
    assert res.ok, res.log[-2000:]
    return str(res.so_path)


@pytest.mark.compile
@pytest.mark.parametrize("name, status, detail", [
    ("ctor_segv.cu", "crashed", "SIGSEGV"),
    ("ctor_abort.cu", "crashed", "SIGABRT"),
    ("ctor_exit.cu", "crashed", "exited with code 0"),
    ("ctor_fork.cu", "crashed", "created processes"),
    ("ctor_hang.cu", "timeout", "no reply"),
    ("ctor_oom.cu", "oom", "limit"),
    ("meta_segv.cu", "crashed", "SIGSEGV"),
    ("meta_wild_pointer.cu", "crashed", "SIGSEGV"),
    ("meta_hang.cu", "timeout", "no reply"),
    ("meta_garbage.cu", "error", "not JSON"),
    ("meta_not_utf8.cu", "error", "not UTF-8"),
])
def test_hostile_library_costs_one_verdict(name, status, detail):
    so = _so(name)
    with WorkerPool() as p:
        out = p.run(probe_library, so, timeout_s=3, mem_limit_bytes=512 << 20)
        assert out.status == status, out
        assert detail in out.detail
        good = p.run(probe_library, _so("control_ok.cu"), timeout_s=30)
        assert good.ok and good.value["meta"]["acc"] == "f32", good


@pytest.mark.compile
def test_control_library_probe():
    with WorkerPool() as p:
        out = p.run(probe_library, _so("control_ok.cu"), timeout_s=30)
    assert out.ok
    assert out.value["symbols"] == {"cudal2_hgemm": True, "cudal2_meta": True,
                                    "cudal2_workspace": False}          # ABI 1: not exported
    assert out.value["meta"]["layout"] == "RR"
