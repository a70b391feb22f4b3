"""`cudal2 tune-model`: one resumable command from a model's config to its tuned GEMMs.

Unit tests drive the steps with campaign's prepare and run replaced by fakes that write what the
real ones write (a pack with a manifest and libraries, a run folder with summary.json), so the
resume rules are checked against files on disk; one compile test runs the real CPU half (mma
builds and the cuBLAS baselines, never CUTLASS) and the GPU half on the fake device.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
from pathlib import Path

import pytest

from cudal2 import cli
from cudal2.harness import provenance
from cudal2.core.identity import source_sha
from cudal2.runs import campaign, progress, tunemodel

TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 128, "_name_or_path": "tiny-llama"}


@pytest.fixture
def tiny(tmp_path) -> Path:
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def _job(model, work, lines, **kw) -> tunemodel.Job:
    opts = {"families": ["mma"], "limit_per_shape": 1, "per_family": 1}
    return tunemodel.Job(model=str(model), work=Path(work), arch="sm_90a", tokens=[64],
                         prepare_options=kw.pop("prepare_options", opts), progress=False,
                         log=lines.append, **kw)


class FakePrepare:
    """campaign.prepare's files without a build: shapes.csv, one library, a manifest (counted)."""

    def __init__(self, fail_after_pack: bool = False):
        self.calls, self.fail_after_pack = [], fail_after_pack

    def __call__(self, shapes_file, arch, out, **kw):
        self.calls.append(dict(kw, arch=arch))
        out = Path(out)
        assert not out.exists() or not any(out.iterdir()), "prepare needs a fresh folder"
        (out / "builds" / "b0").mkdir(parents=True)
        (out / "shapes.csv").write_bytes(Path(shapes_file).read_bytes())
        so = out / "builds" / "b0" / "kernel.so"
        so.write_bytes(b"not a real library")
        src = "// a kernel\n"
        (out / "builds" / "b0" / "kernel.cu").write_text(src)
        if self.fail_after_pack:
            raise RuntimeError("killed before the manifest")
        m = {"schema": campaign.SCHEMA, "arch": arch, "candidates": [
            {"dir": "builds/b0", "label": "b0", "sha": source_sha(src),
             "so_sha256": hashlib.sha256(so.read_bytes()).hexdigest()}],
             "baselines": [], "screenings": 2, "pack_bytes": 100}
        (out / campaign.MANIFEST).write_text(json.dumps(m))
        return m


def _no_gpu(monkeypatch):
    monkeypatch.setattr(provenance, "gpu_visible", lambda: False)


# --- the progress helper --------------------------------------------------------------------------
class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_a_bar_draws_on_a_terminal_with_an_eta(monkeypatch):
    out, err = Stream(True), Stream(True)
    monkeypatch.setattr("sys.stdout", out)
    bar = progress.Bar(4, "planning", unit="shape", stream=err)
    assert bar.enabled
    bar.update()
    bar.update()
    bar.log("  a line tools parse")
    bar.postfix("budget left 01:00")
    bar.close()
    assert "a line tools parse\n" in out.getvalue()         # above the bar, on stdout, whole
    drawn = err.getvalue()
    assert "planning" in drawn and "2/4" in drawn and "budget left 01:00" in drawn
    assert "<" in drawn                                       # tqdm's [elapsed<remaining]


def test_without_tqdm_no_bar_only_the_lines(monkeypatch):
    """A machine without tqdm (a bare GPU image) gets the per-line prints, nothing drawn."""
    monkeypatch.setattr(progress, "_tqdm", lambda *a: None)
    err, lines = Stream(True), []
    monkeypatch.setattr("sys.stdout", Stream(True))
    with progress.Bar(2, "shapes", stream=err, log=lines.append) as bar:
        bar.update()
        bar.log("  1x8x8: ok")
    assert not bar.enabled and err.getvalue() == "" and lines == ["  1x8x8: ok"]


def test_no_bar_off_a_terminal_or_when_asked(monkeypatch):
    """Pipes, logs and tests get the per-line prints only, byte for byte."""
    for stdout_tty, stderr_tty, flag in ((False, True, None), (True, False, None), (True, True, False)):
        out, err = Stream(stdout_tty), Stream(stderr_tty)
        monkeypatch.setattr("sys.stdout", out)
        lines = []
        with progress.Bar(3, "building", enabled=flag, stream=err, log=lines.append) as bar:
            bar.update()
            bar.log("  built x: ok")
        assert not bar.enabled and err.getvalue() == "" and lines == ["  built x: ok"]
    assert progress.wanted(None, Stream(True), Stream(True))
    assert not progress.wanted(None, Stream(True), object())      # no isatty: not a terminal


def test_clock():
    assert progress.clock(75) == "01:15" and progress.clock(3725) == "1:02:05"


# --- the CPU half and its resume ------------------------------------------------------------------
def test_cpu_half_says_what_is_left_for_a_gpu(tiny, tmp_path, monkeypatch):
    _no_gpu(monkeypatch)
    fake = FakePrepare()
    monkeypatch.setattr(campaign, "prepare", fake)
    lines, work = [], tmp_path / "work"
    assert tunemodel.tune(_job(tiny, work, lines)) == 0
    assert len(fake.calls) == 1 and fake.calls[0]["include_tuned"] is False
    assert fake.calls[0]["families"] == ["mma"] and fake.calls[0]["limit_per_shape"] == 1
    # options not given take campaign prepare's defaults
    tunemodel.tune(_job(tiny, tmp_path / "w2", [], prepare_options={}))
    assert {k: fake.calls[1][k] for k in tunemodel.PREPARE_DEFAULTS} == tunemodel.PREPARE_DEFAULTS
    rows = (work / "shapes.csv").read_text().splitlines()
    assert rows[0].startswith("M,N,K,layout") and len(rows) == 1 + 5    # qkv, o, gate_up, down, lm_head
    text = "\n".join(lines)
    assert "tune-model 1/4 shapes: tiny-llama tp=1: 5 rows, 2 distinct shapes" in text
    assert "No CUDA GPU here: left for a GPU (sm_90a)" in text
    assert f"cudal2 tune-model --model {work / 'shapes.csv'} --arch sm_90a --work {work}" in text
    assert f"cudal2 campaign run {work / 'pack'} --db {work / 'results.db'}" in text
    st = json.loads((work / "state.json").read_text())
    assert st["prepare"]["manifest_sha256"] == tunemodel.file_sha(work / "pack" / "manifest.json")


def test_a_second_call_skips_a_valid_pack_and_redoes_a_stale_one(tiny, tmp_path, monkeypatch):
    _no_gpu(monkeypatch)
    fake = FakePrepare()
    monkeypatch.setattr(campaign, "prepare", fake)
    work = tmp_path / "work"

    def call(**kw):
        lines = []
        tunemodel.tune(_job(tiny, work, lines, **kw))
        return "\n".join(lines)

    call()
    text = call()
    assert len(fake.calls) == 1
    assert "(unchanged)" in text and "is ready for these shapes on sm_90a (1 builds): skipped" in text
    # the GPU machine's call (the command the CPU half prints) gives no prepare options: the
    # pack's own hold, from the shapes file it wrote
    lines = []
    tunemodel.tune(_job(work / "shapes.csv", work, lines, prepare_options={}))
    assert len(fake.calls) == 1 and "skipped" in lines[1]
    # the pack is checked, not trusted: a library that no longer hashes as the manifest says
    (work / "pack" / "builds" / "b0" / "kernel.so").write_bytes(b"changed")
    assert "does not match its sha256 in the manifest: preparing" in call()
    assert len(fake.calls) == 2
    # other prepare options, other token counts, another arch: a new pack each
    assert "the prepare options changed" in call(prepare_options={"families": ["mma"], "limit_per_shape": 2,
                                                                  "per_family": 1})
    lines = []
    job = _job(tiny, work, lines)
    job.tokens = [64, 128]
    tunemodel.tune(job)
    assert len(fake.calls) == 4 and "the shapes changed since it was prepared" in "\n".join(lines)
    lines.clear()
    job.arch = "sm_80"
    tunemodel.tune(job)
    assert len(fake.calls) == 5 and "it was prepared for sm_90a, not sm_80" in "\n".join(lines)


def test_a_killed_prepare_leaves_no_pack_that_counts(tiny, tmp_path, monkeypatch):
    _no_gpu(monkeypatch)
    work = tmp_path / "work"
    monkeypatch.setattr(campaign, "prepare", FakePrepare(fail_after_pack=True))
    with pytest.raises(RuntimeError, match="killed"):
        tunemodel.tune(_job(tiny, work, []))
    assert json.loads((work / "state.json").read_text())["prepare"] is None
    fake = FakePrepare()
    monkeypatch.setattr(campaign, "prepare", fake)
    lines = []
    tunemodel.tune(_job(tiny, work, lines))
    assert len(fake.calls) == 1 and "no pack yet: preparing" in "\n".join(lines)
    # a pack with a manifest that state.json never recorded (prepare raised after writing it,
    # e.g. its dry run failed) is made again too
    st = json.loads((work / "state.json").read_text())
    (work / "state.json").write_text(json.dumps(dict(st, prepare=None)))
    lines.clear()
    tunemodel.tune(_job(tiny, work, lines))
    assert len(fake.calls) == 2 and "state.json does not record this pack" in "\n".join(lines)


# --- the GPU half's resume (campaign.run replaced) -----------------------------------------------
class FakeRun:
    """campaign.run's summary and run folder; `stopped` mimics a run the budget cut."""

    def __init__(self, stopped=None):
        self.calls, self.stopped = [], stopped

    def __call__(self, pack, out, **kw):
        self.calls.append(kw)
        run_dir = Path(out) / "Fake_GPU" / f"run{len(list(Path(out).rglob('summary.json')))}"
        run_dir.mkdir(parents=True)
        s = {"gpu": "Fake GPU", "run_dir": str(run_dir), "complete": True, "shapes_planned": 2,
             "shapes_done": 1 if self.stopped else 2, "exported": 1}
        if self.stopped:
            s["stopped"] = self.stopped
        (run_dir / "summary.json").write_text(json.dumps(s))
        (run_dir / "export.txt").write_text("exported (sm_90a, 64x64x64): faster\nrefused  (x): slower\n")
        return s


def test_the_run_resumes_on_its_db_until_every_shape_is_timed(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "gpu_visible", lambda: True)
    monkeypatch.setattr(provenance, "gpu_name", lambda: "Fake GPU")
    monkeypatch.setattr(campaign, "prepare", FakePrepare())
    replays = []
    monkeypatch.setattr(tunemodel, "replay", lambda job: replays.append(job) or 0)
    work = tmp_path / "work"
    cut = FakeRun(stopped="deadline: stopped after 1 of 2 shapes")
    monkeypatch.setattr(campaign, "run", cut)
    lines = []
    assert tunemodel.tune(_job(tiny, work, lines, budget_s=60, kernels_out=str(tmp_path / "gk"))) == 0
    kw = cut.calls[0]
    assert kw["db_path"] == work / "results.db" and kw["budget_s"] == 60
    assert kw["kernels_root"] == str(tmp_path / "gk")
    assert "run the same command again to go on" in "\n".join(lines)
    full = FakeRun()
    monkeypatch.setattr(campaign, "run", full)
    lines.clear()
    tunemodel.tune(_job(tiny, work, lines))
    assert len(full.calls) == 1 and full.calls[0]["budget_s"] == float("inf")
    text = "\n".join(lines)
    assert "tune-model 4/4 served: Fake GPU" in text      # `cudal2 served`'s table follows
    assert "this run exported 1 of 2 rows" in text and len(replays) == 2
    lines.clear()
    tunemodel.tune(_job(tiny, work, lines))
    assert len(full.calls) == 1 and "run: done earlier on Fake GPU" in "\n".join(lines)
    # another table to export into is another run (the DB keeps what was timed)
    tunemodel.tune(_job(tiny, work, [], kernels_out=str(tmp_path / "gk2")))
    assert len(full.calls) == 2
    # another GPU is another run
    monkeypatch.setattr(provenance, "gpu_name", lambda: "Other GPU")
    tunemodel.tune(_job(tiny, work, [], kernels_out=str(tmp_path / "gk2")))
    assert len(full.calls) == 3


# --- the command line ---------------------------------------------------------------------------
def test_command_line_errors_are_one_line(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K,layout\n64,64,64,RC\n")
    assert cli.main(["tune-model", "--model", str(shapes), "--tp", "2", "--arch", "sm_90a"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a shapes file: --tp" in err
    assert cli.main(["tune-model", "--model", str(tmp_path / "nope"), "--arch", "sm_90a"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope" in err
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "state.json").write_text("{not json")
    assert cli.main(["tune-model", "--model", str(tiny), "--arch", "sm_90a", "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert "state.json: not JSON" in err and err.count("\n") == 0


def test_default_work_folder_and_options(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    parser = argparse.ArgumentParser()
    tunemodel.configure_parser(parser)
    job = tunemodel.job_from_args(parser.parse_args(
        ["--model", str(tiny), "--tp", "2", "--tokens", "1,16", "--arch", "sm_80", "--no-progress"]))
    assert job.work == tmp_path / "cache" / "tune-model" / "tiny-llama-tp2-sm_80"
    assert job.tokens == [1, 16] and job.tp == 2 and job.progress is False
    assert job.prepare_options == {}                  # not given: the pack's, else prepare's defaults
    job = tunemodel.job_from_args(parser.parse_args(
        ["--model", str(tiny), "--arch", "sm_90a", "--limit-per-shape", "0", "--families", "ptx", "mma"]))
    assert job.prepare_options == {"limit_per_shape": None, "families": ["mma", "ptx"]}
    assert "tune-model" in cli.VERBS


# --- the real thing: nvcc builds, the fake device times -------------------------------------------
@pytest.mark.compile
def test_end_to_end_on_the_fake_device(tiny, tmp_path, monkeypatch, capsys):
    """The CPU half with real builds (mma and the baselines), then the run on the fake device; a
    second call skips both; nothing the fake device measured is exported."""
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    _no_gpu(monkeypatch)
    work, lines = tmp_path / "work", []
    job = _job(tiny, work, lines, kernels_out=str(tmp_path / "gk"), jobs=2)
    job.progress = True                        # bars on stderr, lines through the log as before
    assert tunemodel.tune(job) == 0
    err = capsys.readouterr().err
    assert "planning" in err and "building" in err
    m = campaign.load_manifest(work / "pack")
    assert m["layout"] == "RC" and m["shapes"] == [[64, 128, 64], [64, 64, 64]]
    assert any("dry run" in l and "0 problem(s)" in l for l in lines)
    assert any("left for a GPU" in l for l in lines)
    monkeypatch.undo()                          # the fake device is this test's GPU
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.05")
    provenance.gpu_visible.cache_clear()
    provenance.gpu_name.cache_clear()
    try:
        lines.clear()
        assert tunemodel.tune(job) == 0
        text = "\n".join(lines)
        assert "prepare: " in text and "skipped" in text.split("tune-model 3/4")[0]
        assert "campaign done" in text and "this run exported 0 of 2 rows" in text
        assert "replay: needs a real CUDA GPU" in text
        assert not (tmp_path / "gk" / "index.csv").exists()
        lines.clear()
        tunemodel.tune(job)
        assert "run: done earlier on fake device" in "\n".join(lines)
    finally:
        provenance.gpu_visible.cache_clear()
        provenance.gpu_name.cache_clear()
