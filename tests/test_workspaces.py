"""The runtime's workspaces (cudal2/runtime/loader.py Workspaces) under CUDA graph capture, with
torch's capture API faked and every allocation recorded (no GPU).

The hazard (issue 32): graphs captured on torch.cuda.graph's one capture stream shared the
stream's zero-init buffer, zeroed by a memset recorded in the first graph only; replayed first, a
later graph found split-K semaphores holding garbage. What must hold: a buffer a captured call
uses belongs to that graph alone (never an eager stream's, never another graph's), a zero-init
buffer's zero-fill runs where that graph runs it (recorded in the same capture, or eagerly), and
a capture whose graph cannot be named gets no buffer (torch serves the call)."""
from __future__ import annotations

import gc

import torch

from cudal2.runtime.loader import Workspaces


class Graph:
    """Stands in for torch.cuda.CUDAGraph: weakly referenceable, hashable by identity."""


class Recorder:
    """The fake capture state and the allocations made under it: (capturing graph, zero, bytes)."""

    def __init__(self):
        self.graph = None           # the graph being captured, None when eager
        self.allocs: list[tuple] = []

    def capturing(self) -> bool:
        return self.graph is not None

    def capturing_graph(self):
        return self.graph

    def alloc(self, dev: int, nbytes: int, zero: bool) -> torch.Tensor:
        self.allocs.append((self.graph, zero, nbytes))
        return (torch.zeros if zero else torch.empty)(nbytes, dtype=torch.uint8)


def workspaces():
    rec = Recorder()
    return Workspaces(capturing=rec.capturing, capturing_graph=rec.capturing_graph,
                      alloc=rec.alloc), rec


def test_eager_buffers_are_per_stream_and_zero_init_apart():
    ws, rec = workspaces()
    a = ws.get(0, 7, 4096, zero=True)
    assert ws.get(0, 7, 2048, zero=True) == a            # reused, never zeroed again
    assert ws.get(0, 8, 4096, zero=True) != a            # another stream: its own
    assert ws.get(0, 7, 4096, zero=False) != a           # scratch never shares a zero-init buffer
    assert [z for _, z, _ in rec.allocs] == [True, True, False]
    big = ws.get(0, 7, 4 << 20, zero=True)               # grown: a new zeroed buffer
    assert big != a and rec.allocs[-1] == (None, True, 4 << 20)


def test_two_graphs_on_one_capture_stream_get_their_own_buffers_zeroed_in_their_own_capture():
    """The scenario of tests/data/splitk_graph_replay.py: one shape resolved and served eagerly,
    then two graphs captured on the same capture stream (id 99); each graph's zero-init buffer is
    allocated and zero-filled while that graph is captured, so its replay zeroes it first, and
    no other graph or stream ever touches it: replay order cannot matter."""
    ws, rec = workspaces()
    eager = ws.get(0, 5, 1 << 20, zero=True)
    g1, g2 = Graph(), Graph()
    rec.graph = g1
    p1 = ws.get(0, 99, 1 << 20, zero=True)
    assert ws.get(0, 99, 1 << 20, zero=True) == p1       # the same graph's later calls share it
    rec.graph = g2
    p2 = ws.get(0, 99, 1 << 20, zero=True)
    rec.graph = None
    assert len({eager, p1, p2}) == 3
    assert ws.get(0, 99, 1 << 20, zero=True) not in (p1, p2)   # eager use of the capture stream
    zero_fills = [(g, n) for g, z, n in rec.allocs if z]
    assert zero_fills[1:3] == [(g1, 1 << 20), (g2, 1 << 20)]    # each recorded in its own capture


def test_a_graph_holds_its_buffers_while_it_lives_and_no_longer():
    ws, rec = workspaces()
    g = Graph()
    rec.graph = g
    ws.get(0, 99, 1 << 20, zero=True)
    ws.get(0, 99, 1 << 20, zero=False)
    rec.graph = None
    assert len(ws._graph_bufs) == 1 and len(ws._graph_bufs[g]) == 2
    rec.allocs.clear()                                   # the recorder's own references
    del g
    gc.collect()
    assert len(ws._graph_bufs) == 0


def test_a_capture_whose_graph_is_unknown_gets_no_buffer():
    ws, rec = workspaces()
    rec.graph = Graph()
    ws._capturing_graph = lambda: None                   # a torch without the binding, a raw capture
    assert ws.get(0, 99, 1 << 20, zero=True) is None
    assert rec.allocs == []


def test_the_hot_path_serves_torch_when_no_buffer_is_safe(monkeypatch):
    """hot.launch reaches a served split-K kernel inside an unknown capture: it launches nothing
    and returns None (torch.matmul serves the call), and the shape stays served for later."""
    from cudal2.runtime import hot, resolve

    a = torch.empty(64, 4096, dtype=torch.float16)
    b = torch.empty(4096, 256, dtype=torch.float16)
    launched = []
    entry = (lambda *args: launched.append(args) or 0, 4096, None, None, True)
    key = (0, 64, 256, 4096, "RR")
    monkeypatch.setitem(resolve.serving, key, entry)
    monkeypatch.setattr(hot, "_cur_device", lambda: 0)
    monkeypatch.setattr(hot, "_raw_stream", lambda dev: 99)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(hot, "_workspace", lambda *args: None)
    assert hot.launch(a, b, None) is None
    assert launched == [] and resolve.serving[key] is entry
