"""cudal2.harness.metacheck: a meta's threads and tile against the binary; a lie is rejected."""
from pathlib import Path

import pytest

from cudal2.harness import metacheck as MC

DATA = Path(__file__).parent / "data" / "adversarial"

PTX = """
.visible .entry gemm(
.param .u64 a
)
.maxntid 128, 1, 1
{
	ret;
}
.visible .entry zero(
.param .u64 c
)
.reqntid 16, 16, 1
{
	ret;
}
"""


def test_launch_bounds_per_entry():
    assert MC.launch_bounds(PTX) == {"gemm": 128, "zero": 256}
    assert MC.launch_bounds(".visible .entry k()\n{\n\tret;\n}\n") == {}


def test_threads_against_launch_bounds():
    assert MC.check_threads({"threads": 128}, PTX).verified == ["threads"]
    assert MC.check_threads({"threads": 256}, PTX).verified == ["threads"]      # the other entry
    lie = MC.check_threads({"threads": 512}, PTX)
    assert lie.reasons and "threads 512" in lie.reasons[0] and "128" in lie.reasons[0]
    assert MC.check_threads({"threads": "many"}, PTX).reasons
    # no meta threads: nothing claimed; no bounds anywhere: unverified, said so
    assert MC.check_threads({}, PTX) == MC.MetaCheck()
    none = MC.check_threads({"threads": 128}, ".visible .entry k()\n{\n\tret;\n}\n")
    assert not none.reasons and not none.verified and "unverified" in none.notes[0]
    # an entry without bounds could be the launched one: unverified, not a lie
    part = MC.check_threads({"threads": 512}, PTX + ".visible .entry free()\n{\n\tret;\n}\n")
    assert not part.reasons and "unverified" in part.notes[0]


def test_the_shape_a_meta_claims():
    assert MC.claimed_shape({"tile": [64, 128, 16], "any_shape": False}) == (64, 128, 16)
    assert MC.claimed_shape({"tile": [64, 128, 16], "any_shape": True, "divisible": [1, 8, 8]}) == (1, 8, 8)
    assert MC.claimed_shape({"tile": [64, 128, 16], "any_shape": True}) == (1, 1, 1)
    assert MC.claimed_shape({"tile": [64, 16], "any_shape": False}) is None
    # a split-K kernel serves K multiples of BK * splits only
    assert MC.claimed_shape({"tile": [64, 64, 32], "any_shape": False, "divisible": [1, 1, 128]}) \
        == (64, 64, 128)


@pytest.mark.compile
def test_audit_rejects_metas_the_binary_contradicts():
    from cudal2.harness.audit import audit_file
    honest = audit_file(DATA / "honest.cu")
    assert honest.ok and sorted(honest.meta_verified) == ["threads", "tile"]
    threads = audit_file(DATA / "flattering_meta.cu")           # tile 128x128, threads 256
    assert not threads.ok and any("threads 256" in r and "128" in r for r in threads.reasons)
    # the coarser tile only narrows where it serves: not a lie, and verified (its guard takes it)
    assert "tile" in threads.meta_verified
    fine = audit_file(DATA / "fine_tile.cu")                    # tile 32x32: its guard needs 64
    assert not fine.ok and any("tile [32, 32, 16]" in r and "refuses" in r for r in fine.reasons)
    assert fine.meta_verified == ["threads"]
    # any_shape claimed by a kernel whose guard wants multiples of 64
    from cudal2.harness.audit import audit_source
    src = (DATA / "honest.cu").read_text().replace('\\"any_shape\\": false', '\\"any_shape\\": true')
    assert src != (DATA / "honest.cu").read_text()
    anys = audit_source(src, name="any_shape_liar")
    assert not anys.ok and any("any_shape" in r and "1x1x1" in r for r in anys.reasons)


def test_dispatch_serves_an_unverified_tile_only_at_its_measured_shape():
    """plan(verified=...): a kernel whose tile the audit did not confirm serves only the shape it
    was measured at; a verified one also serves the nearest shapes its tile divides."""
    from cudal2.runtime.plan import TableEntry, plan
    def entry(M, N, K):
        return TableEntry("sm_90a", "f32", "RR", M, N, K, f"sm_90a/f32_RR/{M}_{N}_{K}.cu",
                          f"{M:04x}{N:04x}{K:04x}".ljust(64, "0"), tuned=True)
    a, b = entry(256, 256, 256), entry(512, 512, 512)
    t = {(e.arch, e.acc, e.layout, e.M, e.N, e.K): e for e in (a, b)}
    metas = {e.sha256: {"any_shape": False, "tile": [64, 64, 16]} for e in (a, b)}
    near = plan((384, 384, 384), "RR", "sm_90a", "f32", t, metas=metas)
    assert near.kind == "nearest" and len(near.candidates) == 2          # trusting the meta
    only_b = plan((384, 384, 384), "RR", "sm_90a", "f32", t, metas=metas,
                  verified={b.sha256: ["threads", "tile"], a.sha256: ["threads"]})
    assert only_b.kind == "nearest" and only_b.candidates == (b,)
    none = plan((384, 384, 384), "RR", "sm_90a", "f32", t, metas=metas, verified={})
    assert none.kind == "fallback"
    exact = plan((256, 256, 256), "RR", "sm_90a", "f32", t, metas=metas, verified={})
    assert exact.kind == "exact" and exact.candidates == (a,)
