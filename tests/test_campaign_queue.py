"""The RL queue -> a campaign pack (`cudal2 campaign prepare --sources-queue`), the GPU kit's
queue stage: rows read and grouped by source, most wanted first; the pack holds each queued source
at its own shapes, built and audited here, and a carry limit leaves the least counted out first."""
import json

import pytest

from cudal2.core.identity import source_sha
from cudal2.runs import campaign
from cudal2.templates import FAMILIES, enumerate_space, instantiate


def _queue(tmp_path, sources: list[str], shapes, counts):
    """A queue in rl/table.py's Queue format: JSONL rows, sources/<sha>.cu beside it."""
    (tmp_path / "sources").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (src, n) in enumerate(zip(sources, counts)):
        sha = source_sha(src)
        (tmp_path / "sources" / f"{sha}.cu").write_text(src)
        rows += [{"binary_key": f"k{i}", "M": M, "N": N, "K": K, "count": n, "source_sha": sha,
                  "source_file": f"sources/{sha}.cu"} for M, N, K in shapes]
    q = tmp_path / "queue.jsonl"
    q.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return q


def test_queue_rows_group_by_source_most_counted_then_newest_first(tmp_path):
    srcs = ["int a;\n", "int b;\n", "int c;\n"]
    q = _queue(tmp_path, srcs, [(64, 64, 64), (128, 64, 256)], counts=[2, 5, 2])
    rows = campaign.read_queue(q)
    assert len(rows) == 6 and rows[0]["source"] == "int a;\n" and rows[0]["M"] == 64
    groups = campaign.queue_sources(rows)
    # b is counted most; a and c tie, c was queued later: a (the oldest) is left out first
    assert [g["source"] for g in groups] == ["int b;\n", "int c;\n", "int a;\n"]
    assert groups[0]["shapes"] == [[64, 64, 64], [128, 64, 256]] and groups[0]["count"] == 10


def test_a_queue_row_without_its_source_or_a_field_is_named(tmp_path):
    q = _queue(tmp_path, ["int a;\n"], [(64, 64, 64)], counts=[1])
    for f in (tmp_path / "sources").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match="row 1: source .* missing"):
        campaign.read_queue(q)
    q.write_text(json.dumps({"M": 1, "N": 1, "K": 1}) + "\n")
    with pytest.raises(ValueError, match="missing binary_key, count, source_sha, source_file"):
        campaign.read_queue(q)


@pytest.mark.compile
def test_prepare_queue_packs_each_source_at_its_shapes_within_the_limit(tmp_path):
    """Two mma instantiations and one that does not compile, at two shapes: the broken one stays
    here (logged), the others are packed at their queued shapes with their family and config;
    with a limit that holds only one, the least counted is left out, with a line."""
    cs = [c for c in enumerate_space(FAMILIES["mma"], arch="sm_90a") if dict(c.params)["SPLITK"] == 1]
    good = [instantiate(cs[0]), instantiate(cs[len(cs) // 2])]
    q = _queue(tmp_path / "q", good + ["this is not CUDA\n"], [(128, 128, 128), (256, 128, 512)],
               counts=[1, 3, 9])
    lines = []
    m = campaign.prepare_queue(q, "sm_90a", tmp_path / "pack", jobs=2, log=lines.append)
    assert [c["sha"] for c in m["candidates"]] == [source_sha(good[1]), source_sha(good[0])]
    assert all(c["family"] == "mma" and c["params"] and c["shapes"] == [[128, 128, 128], [256, 128, 512]]
               for c in m["candidates"])
    assert m["shapes"] == [[128, 128, 128], [256, 128, 512]] and m["screenings"] == 4
    assert any(l.startswith("  left out ") for l in lines)               # the broken source
    assert campaign.dry_run(tmp_path / "pack", log=lambda *a: None) == []
    sizes = {c["sha"]: campaign._dir_bytes(tmp_path / "pack" / c["dir"]) for c in m["candidates"]}
    base = m["pack_bytes"] - sum(sizes.values())                  # baselines, manifest, shapes.csv
    limit = base + (64 << 10) + sizes[source_sha(good[1])] + sizes[source_sha(good[0])] // 2
    lines.clear()
    m2 = campaign.prepare_queue(q, "sm_90a", tmp_path / "small", jobs=2, max_pack_bytes=limit,
                                log=lines.append)
    assert [c["sha"] for c in m2["candidates"]] == [source_sha(good[1])]
    assert m2["queue"]["left_out"] == 1
    assert any("carry limit: 1 of 3 queued sources (2 rows) left out" in l for l in lines)


def _confirm(tmp_path, sources: list[str], shape) -> object:
    """An experiment's confirm.jsonl (rl/experiment/report.confirm): one shape, each source an
    arm's winner, sources/<sha>.cu beside it."""
    (tmp_path / "sources").mkdir(parents=True, exist_ok=True)
    entrants = []
    for i, src in enumerate(sources):
        sha = source_sha(src)
        (tmp_path / "sources" / f"{sha}.cu").write_text(src)
        entrants.append({"binary_key": f"k{i}", "source_sha": sha, "table_us": 10.0 + i,
                         "source_file": f"sources/{sha}.cu", "chosen_by": [["arm", i]]})
    f = tmp_path / "confirm.jsonl"
    f.write_text(json.dumps({"M": shape[0], "N": shape[1], "K": shape[2], "arch": "sm_90a", "gpu": "T",
                             "baseline": "cublaslt_autotuned", "entrants": entrants}) + "\n")
    return f


def test_a_confirm_file_missing_a_source_is_named(tmp_path):
    f = _confirm(tmp_path, ["int a;\n"], (64, 64, 64))
    for p in (tmp_path / "sources").iterdir():
        p.unlink()
    with pytest.raises(ValueError, match="line 1: source .* missing"):
        campaign.read_confirm(f)


@pytest.mark.compile
def test_a_confirm_pack_sends_every_arms_winner_to_one_finals_session(tmp_path, monkeypatch):
    """`campaign prepare --sources-confirm`: four arms' winners at one held-out shape; the run (on
    the fake device) screens them and sends all four to the shape's finals, where the usual rule
    sends at most 3 (FinalistPolicy.cap); a confirm pack refuses to run beside another pack."""
    from cudal2.harness import provenance
    from cudal2.harness.db import ResultsDB
    cs = [c for c in enumerate_space(FAMILIES["mma"], arch="sm_90a") if dict(c.params)["SPLITK"] == 1]
    srcs = [instantiate(cs[i * len(cs) // 4]) for i in range(4)]      # more than the usual cap (3)
    shape = (128, 128, 128)
    m = campaign.prepare_queue(_confirm(tmp_path / "c", srcs, shape), "sm_90a", tmp_path / "pack",
                               jobs=2, confirm=True, log=lambda *a: None)
    assert m["finalists"] == campaign.EVERY_ENTRANT and len(m["candidates"]) == 4
    assert all(c["group"] == c["sha"] and c["shapes"] == [list(shape)] for c in m["candidates"])
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.02")
    provenance.gpu_visible.cache_clear()
    provenance.gpu_name.cache_clear()
    try:
        s = campaign.run(tmp_path / "pack", tmp_path / "rep", budget_s=300, finals_per_shape=1,
                         modes=("offline",), kernels_root=tmp_path / "gk", db_path=tmp_path / "c.db",
                         log=lambda *a: None)
    finally:
        monkeypatch.delenv("CUDAL2_FAKE_DEVICE")
        provenance.gpu_visible.cache_clear()
        provenance.gpu_name.cache_clear()
    assert s["complete"] and s["shapes_done"] == 1
    with ResultsDB(tmp_path / "c.db", readonly=True) as db:
        finals = {ev.source_sha for ev in db.rows(stage="final")}
    assert finals == {c["sha"] for c in m["candidates"]}
    q = _queue(tmp_path / "q", srcs[:1], [shape], counts=[1])
    campaign.prepare_queue(q, "sm_90a", tmp_path / "plain", jobs=2, log=lambda *a: None)
    with pytest.raises(ValueError, match="a confirm pack .* runs alone"):
        campaign.run([tmp_path / "pack", tmp_path / "plain"], tmp_path / "rep2", allow_no_gpu=True,
                     log=lambda *a: None)
