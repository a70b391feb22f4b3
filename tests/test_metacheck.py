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
