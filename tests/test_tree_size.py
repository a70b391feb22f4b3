"""A tree that travels light: every tracked byte is copied to a lent GPU machine with each call
(64 MiB in all, with the carried build cache and the campaign pack), so the tracked tree stays
under TREE_LIMIT, committed results DBs and large row dumps and logs under reports/ are kept gzipped
(reports/README.md), and the markdown that points at report files still resolves."""
import gzip
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
TREE_LIMIT = 20 * 2**20          # bytes of all tracked files together
GZIP_OVER = 64 * 2**10           # a row dump or log under reports/ larger than this is committed .gz
GZIP_SUFFIXES = (".csv", ".jsonl", ".log", ".xml")


def _tracked() -> list[Path]:
    """Tracked files present in the working tree; skips when this is not a git checkout."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--show-toplevel"],
                       capture_output=True, text=True)
    if r.returncode != 0 or Path(r.stdout.strip()).resolve() != REPO:
        pytest.skip(f"{REPO} is not the top of a git checkout")
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True,
                         check=True).stdout.decode()
    paths = [REPO / f for f in out.split("\0") if f]
    return [p for p in paths if p.is_file() or p.is_symlink()]   # a deleted, uncommitted file is not sent


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def test_the_tracked_tree_stays_under_the_limit():
    sizes = sorted(((p.lstat().st_size, p) for p in _tracked()), reverse=True)
    total = sum(s for s, _ in sizes)
    largest = "\n".join(f"  {_mib(s):>10}  {p.relative_to(REPO)}" for s, p in sizes[:15])
    assert total <= TREE_LIMIT, (
        f"tracked files total {_mib(total)}, over {_mib(TREE_LIMIT)} (every tracked byte goes to "
        f"each GPU call, 64 MiB in all): gzip results DBs and large CSVs under reports/ "
        f"(`gzip -9n FILE`, readers take the .gz), or drop what a command remakes. Largest:\n{largest}")


def test_reports_keep_results_dbs_and_large_dumps_gzipped():
    """What collect.sh brings back is committed as results.db.gz and, over GZIP_OVER, row dumps
    and logs (CSV, JSONL, logs, junit XML) as name.gz; every committed .gz under reports/
    decompresses whole (CRC checked)."""
    reports = [p for p in _tracked() if p.relative_to(REPO).parts[0] == "reports"]
    raw = [f"{p.relative_to(REPO)} ({_mib(p.stat().st_size)})" for p in reports
           if p.suffix == ".db" or (p.suffix in GZIP_SUFFIXES and p.stat().st_size > GZIP_OVER)]
    assert not raw, ("commit these gzipped (`gzip -9n FILE`; ResultsDB and `cudal2 report`/"
                     f"`db merge`/`export` read a .db.gz as it is): {raw}")
    for p in reports:
        if p.suffix == ".gz":
            with gzip.open(p, "rb") as f:
                while f.read(1 << 20):
                    pass


_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*(?:<([^>\n]+)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(text: str) -> list[str]:
    """The relative link targets of a markdown text (code blocks and spans, URLs and in-page
    anchors left out; a target's own #anchor dropped)."""
    text = _CODE.sub("", _FENCE.sub("", text))
    out = []
    for m in _LINK.finditer(text):
        t = m.group(1) or m.group(2)
        if t.startswith("#") or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", t):
            continue
        out.append(unquote(t.split("#", 1)[0]))
    return [t for t in out if t]


def test_relative_links_parse():
    text = ("[a](x/y.md) ![p](p.png \"t\") [w](https://e.org/a) [s](#here) [h](d/#sec) "
            "`[c](code.md)`\n```\n[f](fenced.md)\n```\n  ~~~\n[g](g.md)\n  ~~~\n[b](<sp ace.md>)")
    assert relative_links(text) == ["x/y.md", "p.png", "d/", "sp ace.md"]


def test_every_relative_link_in_tracked_markdown_resolves():
    """README.md, docs/ and reports/: a link to a renamed (e.g. gzipped) or moved file fails here."""
    mds = [p for p in _tracked() if p.suffix == ".md"
           and (p.relative_to(REPO).parts[0] in ("docs", "reports") or p == REPO / "README.md")]
    dangling = [f"{p.relative_to(REPO)} -> {t}" for p in mds
                for t in relative_links(p.read_text(encoding="utf-8")) if not (p.parent / t).exists()]
    assert mds, "no tracked markdown found"
    assert not dangling, dangling
