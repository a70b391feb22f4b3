"""`cudal2 reaudit`: a table's rows audited under older rules are audited again (build, static
rules, the call guard's dry call); those whose kernels pass get this cudal2's audit version and
serve again, the others stay as they were, unserved, with the reasons printed."""
from pathlib import Path

import pytest

from cudal2.cli import main
from cudal2.core.store import KernelIndex
from cudal2.core.tables import load_tables
from cudal2.core.vocab import AUDIT_VERSION
from cudal2.harness import callguard

HOSTILE = Path(__file__).parent / "data" / "hostile"
TUNED = dict(arch="sm_90a", acc="f32", layout="RR", N=256, K=256, family="mma", tuned=True,
             mode="offline", report="run", speedups={"torch": 1.5}, speedup_lo=1.4)


def _table(root: Path) -> KernelIndex:
    """Rows of older rules: control_ok.cu at two shapes (one kernel), per_thread_handle.cu (the
    per-thread stream by its value: only the dry call sees it), and one already current."""
    idx = KernelIndex(root)
    ok = (HOSTILE / "control_ok.cu").read_text()
    idx.add(ok, M=64, audit=1, **TUNED)
    idx.add(ok, M=128, **TUNED)                                     # before audit versions
    idx.add((HOSTILE / "per_thread_handle.cu").read_text(), M=256, audit=1, **TUNED)
    idx.add(ok + "// current\n", M=512, audit=AUDIT_VERSION, **TUNED)
    idx.write()
    return idx


@pytest.mark.compile
def test_reaudit_marks_the_kernels_that_pass_and_leaves_the_others_unserved(tmp_path, capsys):
    root = tmp_path / "table"
    _table(root)
    assert main(["reaudit", "--table", str(root)]) == 1
    out = capsys.readouterr().out
    assert "ok        sm_90a/f32_RR/64_256_256.cu (sm_90a, 2 row(s), binary key " in out
    assert "REJECTED  sm_90a/f32_RR/256_256_256.cu (sm_90a, 1 row(s)" in out
    assert "refused __cudaLaunchKernel:on cudaStreamPerThread in a dry call" in out
    assert f"1 kernel(s) now audited v{AUDIT_VERSION}, 1 still not served" in out
    back = {r.M: r.audit for r in KernelIndex.load(root).rows}
    assert back == {64: AUDIT_VERSION, 128: AUDIT_VERSION, 256: 1, 512: AUDIT_VERSION}
    served = load_tables(shipped=root, user=tmp_path / "none")
    assert sorted(r.M for r in served.rows.values()) == [64, 128, 512]
    assert [u.row.M for u in served.unaudited] == [256]
    # again: only the rejected kernel is left, and it is rejected again
    assert main(["reaudit", "--table", str(root)]) == 1
    assert "0 kernel(s) now audited" in capsys.readouterr().out


@pytest.mark.compile
def test_reaudit_without_a_dry_call_changes_nothing(tmp_path, capsys, monkeypatch):
    """No host C compiler, no call guard: the audit cannot reach this version, so no row moves."""
    root = tmp_path / "table"
    _table(root)
    before = (root / "index.csv").read_bytes()

    def no_compiler(cache=None):
        raise callguard.CallGuardError("the call guard needs a host C compiler (cc, gcc or clang)")
    monkeypatch.setattr(callguard, "build", no_compiler)
    assert main(["reaudit", "--table", str(root)]) == 1
    out = capsys.readouterr().out
    assert "2 kernel(s) not audited" in out and "host C compiler" in out and "nothing changed" in out
    assert (root / "index.csv").read_bytes() == before


def test_reaudit_bad_input_and_nothing_to_do(tmp_path, capsys):
    assert main(["reaudit", "--table", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cudal2 reaudit: no kernel table at {tmp_path / 'nowhere'} (no index.csv)"]
    idx = KernelIndex(tmp_path / "t")
    idx.add("// current\n", M=64, audit=AUDIT_VERSION, **TUNED)
    idx.write()
    assert main(["reaudit", "--table", str(tmp_path / "t")]) == 0
    assert f"every tuned row passed the audit v{AUDIT_VERSION}; nothing to do" in capsys.readouterr().out
    (tmp_path / "t" / "index.csv").write_text("not,a,table\n")
    assert main(["reaudit", "--table", str(tmp_path / "t")]) == 2
    assert "header must be" in capsys.readouterr().err
