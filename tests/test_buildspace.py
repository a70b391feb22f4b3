"""`cudal2 templates --build-space` (cudal2/templates/buildspace.py): the enumeration is the tuner's
over each family's ACC and LAYOUT choices and claimed arches, bad arguments are named, the CSV has
one row per (config, arch) with the documented columns and a bad row makes the command fail
(unit: the build and the SASS reading replaced); a handful of lowlat_mma configs built for real
(compile: nvcc and cuobjdump, no GPU)."""
from __future__ import annotations

import csv

import pytest

from cudal2.core.build import OK, BuildResult, KernelResources
from cudal2.templates import FAMILIES, enumerate_space
from cudal2.templates import buildspace
from cudal2.templates.__main__ import main


def _read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_every_claimed_instruction_has_a_sass_mnemonic():
    assert {f.instruction for f in FAMILIES.values()} <= set(buildspace.SASS_MNEMONIC)


def test_targets_are_the_tuners_space_per_claimed_arch():
    ll, llm = FAMILIES["lowlat"], FAMILIES["lowlat_mma"]
    want = {(c, "sm_90a") for lay in ("RR", "RC") for c in enumerate_space(ll, arch="sm_90a", layout=lay)}
    got = buildspace.space_targets(["lowlat"])
    # BM 2 x BN 2 x STAGES 5 x RR/RC, less 128x128's 8 stages (256 KiB of shared memory)
    assert len(got) == len(set(got)) == len(want) == 38 and set(got) == want
    both = buildspace.space_targets(["lowlat_mma"])
    # 40 for sm_90a, 38 for sm_80 (32x128's 8 stages, 184 KiB, do not fit its 163)
    assert {a for _, a in both} == set(llm.arches) and len(both) == 78
    assert all(llm.valid(c, a) for c, a in both)
    # --arch narrows to one claimed arch; --where keeps a slice
    only80 = buildspace.space_targets(["lowlat_mma"], "sm_80", {"BM": 16, "STAGES": 3})
    assert only80 and all(a == "sm_80" and c.get("BM") == 16 and c.get("STAGES") == 3 for c, a in only80)
    assert len(only80) == 4   # BN 64/128 x RR/RC
    # a family without an ACC knob (skinny) is enumerated for f32
    assert buildspace.space_targets(["skinny"], "sm_90a", {"BM": 16, "BN": 64, "STAGES": 2})


@pytest.mark.parametrize("families,arch,where,needle", [
    (["nope"], None, None, "unknown family 'nope'"),
    (["lowlat"], "sm_80", None, "does not claim sm_80"),
    (["lowlat"], None, {"WM": 32}, "has no parameter WM"),
])
def test_bad_arguments_are_named(families, arch, where, needle):
    with pytest.raises(ValueError, match=needle):
        buildspace.space_targets(families, arch, where)


def _fake_result(name, *, status=OK, spills=0, stack=0):
    res = (KernelResources("lowlat_kernel", 96, 0, spills, 0, stack), KernelResources("zero_kernel", 16, 0, 0, 0, 0))
    return BuildResult(status=status, key=name, so_path=None, ptx_path=None, log="",
                       resources=res if status == OK else (), seconds=1.5, name=name)


def _sass(mnemonic):
    """A cuobjdump -sass listing of two kernels (2 and 3 instructions before the first global
    load) and a zero kernel that loads nothing."""
    def fn(name, body):
        return [f"\t\tFunction : {name}"] + [f"        /*{16 * i:04x}*/   {ins} ;  /* 0x0 */"
                                            for i, ins in enumerate(body)]
    return "\n".join(fn("k_split", ["LDC R1, c[0x0][0x28]", "S2R R0, SR_TID.X",
                                     "LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64]", f"{mnemonic}.16816.F32 R8, R4, R2, R8"])
                     + fn("k_plain", ["LDC R1, c[0x0][0x28]", "S2R R0, SR_TID.X", "IMAD R2, R0, 0x8, RZ",
                                      "LDG.E.128 R4, desc[UR4][R2.64]"])
                     + fn("zero_kernel", ["STG.E [R2.64], RZ", "EXIT"]))


def test_prologue_lengths_count_to_each_entry_s_first_global_load():
    assert buildspace.prologue_lengths(_sass("HMMA")) == {"k_split": 2, "k_plain": 3}
    assert buildspace.sass_mnemonics(_sass("HMMA")) == {"HMMA"}


def test_csv_rows_and_exit_status(tmp_path, monkeypatch, capsys):
    """The build, the SASS and the host imports replaced: one row per target, the columns, the
    summary, and exit 1 as soon as one row spills, misses the instruction, imports a memset or
    fails to build."""
    faults = {}

    def fake_build_many(specs, *, jobs=None, progress=None):
        out = []
        for s in specs:
            r = _fake_result(s.name, **faults.get((s.name, s.arch), {}))
            out.append(r)
            progress(r)
        return out
    monkeypatch.setattr(buildspace, "build_many", fake_build_many)
    monkeypatch.setattr(buildspace, "find_cuobjdump", lambda: "cuobjdump")
    monkeypatch.setattr(buildspace, "disassemble", lambda so, tool: _sass("HMMA"))
    monkeypatch.setattr(buildspace, "undefined_symbols", lambda so: ["cudaLaunchKernel"])
    argv = ["--build-space", "lowlat_mma", "--where", "BM=16", "--where", "STAGES=2"]
    out = tmp_path / "space.csv"

    assert main(argv + ["--csv", str(out)]) == 0
    cols, rows = _read(out)
    assert tuple(cols) == buildspace.COLUMNS
    targets = buildspace.space_targets(["lowlat_mma"], None, {"BM": 16, "STAGES": 2})
    assert [(r["config"], r["arch"]) for r in rows] == [(c.name(), a) for c, a in targets]
    r0 = rows[0]
    assert r0["ok"] == "1" and r0["registers"] == "96" and r0["spills"] == "0" and r0["stack_bytes"] == "0"
    assert r0["instruction"] == "mma.sync" and r0["sass_mnemonic"] == "HMMA" and r0["sass_has_instruction"] == "1"
    assert r0["label"] == targets[0][0].label() and r0["build_seconds"] == "1.5" and r0["bad"] == ""
    assert r0["prologue_instructions"] == "3"      # the longer of the two entries' prologues
    assert "0 failed, 0 with spills or stack, 0 missing the instruction" in capsys.readouterr().out

    (c1, a1), (c2, a2) = targets[1], targets[2]
    faults.update({(c1.name(), a1): {"spills": 8}, (c2.name(), a2): {"status": "compile_error"}})
    assert main(argv + ["--csv", str(out)]) == 1
    _, rows = _read(out)
    assert rows[1]["bad"] == "spills" and rows[1]["spills"] == "8"
    assert rows[2]["ok"] == "0" and rows[2]["bad"] == "build compile_error" and rows[2]["registers"] == ""
    text = capsys.readouterr().out
    assert "1 failed, 1 with spills or stack" in text and f"BAD {c1.name()} {a1}: spills" in text

    faults.clear()
    monkeypatch.setattr(buildspace, "disassemble", lambda so, tool: _sass("HGMMA"))
    monkeypatch.setattr(buildspace, "undefined_symbols", lambda so: ["cudaMemsetAsync", "cudaLaunchKernel"])
    assert main(argv + ["--csv", str(out)]) == 1
    _, rows = _read(out)
    assert all(r["sass_has_instruction"] == "0" and r["memset_memcpy_imports"] == "cudaMemsetAsync" for r in rows)
    assert rows[0]["bad"] == "no HMMA in SASS; imports cudaMemsetAsync"

    def unreadable(so, tool):
        raise RuntimeError("cuobjdump could not disassemble x.so")
    monkeypatch.setattr(buildspace, "disassemble", unreadable)
    monkeypatch.setattr(buildspace, "undefined_symbols", lambda so: [])
    assert main(argv + ["--csv", str(out)]) == 1
    _, rows = _read(out)
    assert {r["bad"] for r in rows} == {"cuobjdump could not disassemble x.so"}


def test_cli_argument_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(buildspace, "find_cuobjdump", lambda: None)
    out = str(tmp_path / "x.csv")
    assert main(["--build-space", "lowlat_mma"]) == 2
    assert "needs --csv" in capsys.readouterr().err
    assert main(["--csv", out]) == 2 and main(["--arch", "sm_80"]) == 2
    assert main(["--build-space", "lowlat", "--where", "BM", "--csv", out]) == 2
    assert main(["--build-space", "lowlat", "--where", "BM=16", "--csv", out]) == 2   # no lowlat config has BM 16
    assert "no valid config" in capsys.readouterr().err
    assert main(["--build-space", "lowlat", "--where", "BM=64", "--where", "BN=64", "--where", "STAGES=2",
                 "--where", "LAYOUT=RR", "--csv", out]) == 2
    assert "cuobjdump not found" in capsys.readouterr().err


@pytest.mark.compile
def test_builds_a_slice_of_lowlat_mma(tmp_path):
    """The real command on 4 lowlat_mma builds (BM 16, BN 64, STAGES 3, RR/RC, sm_80 and sm_90a):
    every row built, no spills, HMMA in the SASS, no Memset/Memcpy import."""
    from cudal2.core.toolchain import find_cuobjdump
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (PATH, next to nvcc, or pip nvidia-cuda-cuobjdump)")
    out = tmp_path / "slice.csv"
    rc = main(["--build-space", "lowlat_mma", "--where", "BM=16", "--where", "BN=64", "--where", "STAGES=3",
               "--csv", str(out)])
    _, rows = _read(out)
    assert rc == 0, [r["bad"] for r in rows]
    assert sorted((r["arch"], r["label"].split("LAYOUT=")[1][:2]) for r in rows) == [
        ("sm_80", "RC"), ("sm_80", "RR"), ("sm_90a", "RC"), ("sm_90a", "RR")]
    for r in rows:
        assert r["ok"] == "1" and r["spills"] == "0" and r["stack_bytes"] == "0" and int(r["registers"]) > 0
        assert r["sass_mnemonic"] == "HMMA" and r["sass_has_instruction"] == "1"
        assert r["memset_memcpy_imports"] == "" and r["bad"] == ""
