"""The generated_kernels/ store: one .cu file per distinct kernel source plus index.csv.

Layout (docs/internals.md)::

    generated_kernels/index.csv
    generated_kernels/<arch>/<acc>_<layout>/<M>_<N>_<K>.cu

index.csv is the manifest: it names, per (arch, acc, layout, M, N, K, gpu), the file that serves
the shape on that GPU model ('' = not recorded), the file's sha256, whether a recorded run showed it beating every baseline (``tuned``),
its speedups and the report they came from. Identical sources are stored once and referenced by
several rows. Only ``tuned == 1`` rows ever serve in dispatch; untuned seeds exist so the
pipeline (build, check, time) has something real to work on.

settled.csv keeps what lost when two measured kernels claimed one row (export's rule,
docs/dispatch.md): the losing kernel's source identity, options, figure, report and DB, next to
the kept one's, so nothing recorded is lost when the table keeps one kernel per row.

Reading validates every row and names the file and line of the first problem; writing is atomic
(temp file + rename), so a reader never sees half an index.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from cudal2.core import knobs
from cudal2.core.identity import content_sha
from cudal2.core.vocab import ACCS, ARCHES, LAYOUTS, OPTION_NAME, gpu_key, m_bucket, normalise_options

INDEX_NAME = "index.csv"
SPEEDUP_COLUMNS = (
    "speedup_torch",
    "speedup_cublas_nn",
    "speedup_cublas_tn",
    "speedup_cublaslt_heuristic",
    "speedup_cublaslt_autotuned",
)
COLUMNS = (
    "arch", "acc", "layout", "M", "N", "K", "file", "sha256", "family", "tuned", "mode",
    *SPEEDUP_COLUMNS, "report", "options", "speedup_lo", "m_bucket", "gpu", "config", "verified",
    "audit",
)
# Columns added after the first release: an index without them still reads (empty values).
OPTIONAL_COLUMNS = ("options", "speedup_lo", "m_bucket", "gpu", "config", "verified", "audit")
# The meta claims the audit can confirm against a kernel's binary (cudal2.harness.metacheck):
# what index column `verified` may list. A row with a `config` (its source is an instantiation of
# one of our own families, cudal2.templates.config_of) is trusted in all of them.
META_FIELDS = ("threads", "tile", "workspace")
SETTLED_NAME = "settled.csv"
# One record per (row key, kept kernel, lost kernel): the rule that settled it and both figures.
SETTLED_COLUMNS = (
    "arch", "acc", "layout", "M", "N", "K", "gpu", "rule",
    "kept_source_sha", "kept_options", "kept_speedup_lo", "kept_report",
    "lost_source_sha", "lost_options", "lost_speedup_lo", "lost_speedups", "lost_report", "lost_db",
)
# Architectures the store may hold (directory names); same spelling as cudal2.core.toolchain.ARCHES.
MODES = ("", "offline", "server", "wall")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class KernelIndexError(ValueError):
    """index.csv or a kernel file is malformed; the message names the file and row."""


def format_options(options) -> str:
    """Runtime options as index.csv writes them: 'name=value;...' sorted by name ('' = none)."""
    return ";".join(f"{k}={v}" for k, v in normalise_options(options))


def parse_options(text: str) -> dict[str, int]:
    """The inverse of format_options; KernelIndexError names a malformed entry."""
    out: dict[str, int] = {}
    for part in filter(None, (text or "").split(";")):
        name, eq, value = part.partition("=")
        try:
            if not eq or not re.fullmatch(OPTION_NAME, name):
                raise ValueError
            out[name] = int(value)
        except ValueError:
            raise KernelIndexError(f"option {part!r} is not name=integer") from None
    return out




@dataclass(frozen=True)
class IndexRow:
    arch: str
    acc: str
    layout: str
    M: int
    N: int
    K: int
    file: str  # relative to the generated_kernels/ root, POSIX separators
    sha256: str
    family: str = ""
    tuned: bool = False
    mode: str = ""
    speedup_torch: float | None = None
    speedup_cublas_nn: float | None = None
    speedup_cublas_tn: float | None = None
    speedup_cublaslt_heuristic: float | None = None
    speedup_cublaslt_autotuned: float | None = None
    report: str = ""
    options: str = ""           # runtime options the kernel is called with: 'name=value;...'
    speedup_lo: float | None = None  # lower end of the speedup interval vs the best baseline
    m_bucket: str = ""          # 'lo-hi': the token counts M this row's kernel serves (vocab.m_bucket); '' = M only
    gpu: str = ""               # the GPU model measured on (vocab.gpu_key); '' = not recorded
    config: str = ""            # KernelConfig.name() when the source is a family instantiation; '' = not one
    verified: str = ""          # meta fields the audit confirmed against the binary: 'threads;tile'
    audit: int | None = None    # the audit version its kernel passed (vocab.AUDIT_VERSION; None:
                                # audited before versions, i.e. 1; 0: its calls never watched)

    @property
    def key(self) -> tuple[str, str, str, int, int, int, str]:
        """One row per (arch, acc, layout, M, N, K, gpu)."""
        return (self.arch, self.acc, self.layout, self.M, self.N, self.K, self.gpu)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    @property
    def speedups(self) -> dict[str, float]:
        """Measured speedups only, keyed by baseline name (column name without 'speedup_')."""
        out = {}
        for col in SPEEDUP_COLUMNS:
            v = getattr(self, col)
            if v is not None:
                out[col[len("speedup_"):]] = v
        return out

    @property
    def bucket(self) -> tuple[int, int] | None:
        """(lo, hi) of the M values the row serves, or None (its own M only)."""
        if not self.m_bucket:
            return None
        lo, _, hi = self.m_bucket.partition("-")
        return int(lo), int(hi)

    @property
    def options_dict(self) -> dict[str, int]:
        return parse_options(self.options)

    @property
    def audit_version(self) -> int:
        """The audit version the row's kernel passed: its `audit` column, 1 when empty (rows
        written before the column were audited under the first rules)."""
        return 1 if self.audit is None else self.audit

    @property
    def trusted_meta(self) -> frozenset[str]:
        """The meta fields dispatch may trust (META_FIELDS): all of them for an instantiation of
        our own families (`config`), else those the audit confirmed (`verified`); a row of an
        index written before these columns trusts none."""
        if self.config:
            return frozenset(META_FIELDS)
        return frozenset(filter(None, self.verified.split(";")))

    def path(self, root: str | os.PathLike) -> Path:
        return Path(root) / self.file

    def label(self) -> str:
        return (f"{self.arch} {self.acc} {self.layout} {self.M}x{self.N}x{self.K}"
                + (f" on {self.gpu}" if self.gpu else ""))

    def to_csv(self) -> dict[str, str]:
        out = {}
        for col in COLUMNS:
            v = getattr(self, col)
            if col == "tuned":
                out[col] = "1" if v else "0"
            elif v is None:
                out[col] = ""
            elif isinstance(v, float):
                out[col] = repr(v)
            else:
                out[col] = str(v)
        return out

    def validate(self, where: str = "row") -> None:
        """Raise KernelIndexError (prefixed by `where`) unless every field is well-formed."""
        def bad(msg: str) -> KernelIndexError:
            return KernelIndexError(f"{where}: {msg}")

        if self.arch not in ARCHES:
            raise bad(f"arch {self.arch!r} is not one of {ARCHES}")
        if self.acc not in ACCS:
            raise bad(f"acc {self.acc!r} is not one of {ACCS}")
        if self.layout not in LAYOUTS:
            raise bad(f"layout {self.layout!r} is not one of {LAYOUTS}")
        for name in ("M", "N", "K"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(f"{name} must be a positive integer, got {v!r}")
        f = self.file
        parts = f.split("/")
        if (not f.endswith(".cu") or "\\" in f or f.startswith("/") or ".." in parts
                or len(parts) != 3 or parts[0] != self.arch
                or parts[1] != f"{self.acc}_{self.layout}"):
            raise bad(f"file {f!r} must be '{self.arch}/{self.acc}_{self.layout}/<name>.cu' "
                      "(relative to generated_kernels/, matching the row's arch, acc and layout)")
        if not _SHA_RE.match(self.sha256):
            raise bad(f"sha256 {self.sha256!r} is not 64 lowercase hex digits")
        if self.mode not in MODES:
            raise bad(f"mode {self.mode!r} is not one of {MODES}")
        for col in SPEEDUP_COLUMNS + ("speedup_lo",):
            v = getattr(self, col)
            if v is not None and not (isinstance(v, float) and v > 0 and v == v and v != float("inf")):
                raise bad(f"{col} must be empty or a positive finite number, got {v!r}")
        try:
            if format_options(parse_options(self.options)) != self.options:
                raise bad(f"options {self.options!r} must be 'name=value;...' sorted by name")
        except KernelIndexError as exc:
            raise bad(str(exc)) from None
        want = "-".join(map(str, m_bucket(self.M)))
        if self.m_bucket not in ("", want):
            # one bucket rule (vocab.m_bucket): a row serves the bucket its own M is in
            raise bad(f"m_bucket {self.m_bucket!r} must be empty or {want!r}, the bucket of M={self.M}")
        if not isinstance(self.gpu, str) or self.gpu != gpu_key(self.gpu):
            raise bad(f"gpu {self.gpu!r} must be a GPU name with single spaces (vocab.gpu_key) or empty")
        if not isinstance(self.config, str) or not re.fullmatch(r"[a-z0-9_]*", self.config):
            raise bad(f"config {self.config!r} must be empty or a config name ([a-z0-9_])")
        fields = self.verified.split(";") if isinstance(self.verified, str) and self.verified else []
        if (not isinstance(self.verified, str) or any(f not in META_FIELDS for f in fields)
                or fields != sorted(set(fields))):
            raise bad(f"verified {self.verified!r} must be empty or 'field;...' sorted, each one "
                      f"of {META_FIELDS}")
        if self.audit is not None and (not isinstance(self.audit, int) or isinstance(self.audit, bool)
                                       or self.audit < 0):
            raise bad(f"audit must be empty or a non-negative integer (an audit version), got {self.audit!r}")
        if self.tuned:
            # The library must never make a user slower: a tuned row carries the run that shows
            # it beating every baseline it was timed against.
            sp = self.speedups
            if not sp:
                raise bad("tuned=1 but no speedup is recorded")
            slow = {k: v for k, v in sp.items() if v <= 1.0}
            if slow:
                raise bad(f"tuned=1 but not faster than baseline(s) {slow}")
            if not self.mode:
                raise bad("tuned=1 but mode is empty (which timing mode showed the win?)")
            if not self.report:
                raise bad("tuned=1 but report is empty (which run showed the win?)")

    @classmethod
    def from_csv(cls, rec: dict[str, str], where: str = "row") -> "IndexRow":
        def bad(msg: str) -> KernelIndexError:
            return KernelIndexError(f"{where}: {msg}")

        def as_int(col: str) -> int:
            s = (rec.get(col) or "").strip()
            try:
                return int(s)
            except ValueError:
                raise bad(f"{col} must be an integer, got {s!r}") from None

        def as_float(col: str) -> float | None:
            s = (rec.get(col) or "").strip()
            if not s:
                return None
            try:
                return float(s)
            except ValueError:
                raise bad(f"{col} must be empty or a number, got {s!r}") from None

        tuned_s = (rec.get("tuned") or "").strip()
        if tuned_s not in ("0", "1"):
            raise bad(f"tuned must be 0 or 1, got {tuned_s!r}")
        row = cls(
            arch=rec["arch"].strip(), acc=rec["acc"].strip(), layout=rec["layout"].strip(),
            M=as_int("M"), N=as_int("N"), K=as_int("K"),
            file=rec["file"].strip(), sha256=rec["sha256"].strip().lower(),
            family=(rec.get("family") or "").strip(), tuned=tuned_s == "1",
            mode=(rec.get("mode") or "").strip(),
            **{c: as_float(c) for c in SPEEDUP_COLUMNS},
            report=(rec.get("report") or "").strip(),
            options=(rec.get("options") or "").strip(), speedup_lo=as_float("speedup_lo"),
            m_bucket=(rec.get("m_bucket") or "").strip(), gpu=(rec.get("gpu") or "").strip(),
            config=(rec.get("config") or "").strip(), verified=(rec.get("verified") or "").strip(),
            audit=as_int("audit") if (rec.get("audit") or "").strip() else None,
        )
        row.validate(where)
        return row


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file and a rename: readers see all or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class KernelIndex:
    """index.csv plus the kernel files under one root (default: knobs.kernels_dir())."""

    def __init__(self, root: str | os.PathLike, rows: Iterable[IndexRow] = ()):
        self.root = Path(root)
        self._rows: dict[tuple, IndexRow] = {}
        self._pending: dict[str, str] = {}  # file -> source, staged by add(), written by write()
        self._settled: list[dict[str, str]] | None = None  # settled.csv, read on first use
        for r in rows:
            if r.key in self._rows:
                raise KernelIndexError(f"{self.index_path}: duplicate row for {r.label()}")
            self._rows[r.key] = r

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_NAME

    @property
    def settled_path(self) -> Path:
        return self.root / SETTLED_NAME

    def settled(self) -> list[dict[str, str]]:
        """settled.csv's records (SETTLED_COLUMNS, as text), oldest first; [] if none."""
        if self._settled is None:
            self._settled = []
            if self.settled_path.exists():
                reader = csv.DictReader(io.StringIO(self.settled_path.read_text(encoding="utf-8")))
                if tuple(reader.fieldnames or ()) != SETTLED_COLUMNS:
                    raise KernelIndexError(f"{self.settled_path}: header must be "
                                           f"{','.join(SETTLED_COLUMNS)}")
                for rec in reader:
                    if None in rec or any(v is None for v in rec.values()):
                        raise KernelIndexError(f"{self.settled_path} line {reader.line_num}: "
                                               f"expected {len(SETTLED_COLUMNS)} fields")
                    self._settled.append(rec)
        return self._settled

    def record_settled(self, **fields) -> bool:
        """Stage one settled.csv record (written by write()); False if it is already there, so
        settling the same pair again adds nothing."""
        unknown = sorted(set(fields) - set(SETTLED_COLUMNS))
        if unknown:
            raise KernelIndexError(f"{self.settled_path}: unknown field(s) {unknown}")
        rec = {c: "" if fields.get(c) is None else str(fields.get(c)) for c in SETTLED_COLUMNS}
        rows = self.settled()
        if rec in rows:
            return False
        rows.append(rec)
        return True

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, root: str | os.PathLike | None = None, *, verify: bool = True) -> "KernelIndex":
        """Read <root>/index.csv. A missing index is an empty store (nothing tuned yet).

        verify=True also checks that every referenced file exists and hashes to its sha256.
        """
        if root is None:
            root = knobs.kernels_dir()
        idx = cls(root)
        path = idx.index_path
        if not path.exists():
            return idx
        text = path.read_text(encoding="utf-8")
        reader = csv.DictReader(io.StringIO(text))
        header = tuple(reader.fieldnames or ())
        missing = [c for c in COLUMNS if c not in header and c not in OPTIONAL_COLUMNS]
        unknown = [c for c in header if c not in COLUMNS]
        if missing or unknown:
            raise KernelIndexError(
                f"{path}: header must be {','.join(COLUMNS)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else ""))
        seen_sha: dict[str, str] = {}
        for rec in reader:
            where = f"{path} line {reader.line_num}"
            if None in rec or any(v is None for v in rec.values()):
                raise KernelIndexError(f"{where}: expected {len(header)} fields")
            row = IndexRow.from_csv(rec, where)
            if row.key in idx._rows:
                raise KernelIndexError(f"{where}: duplicate row for {row.label()}")
            if verify:
                prev = seen_sha.get(row.file)
                if prev is None:
                    f = row.path(idx.root)
                    if not f.is_file():
                        raise KernelIndexError(f"{where}: kernel file {f} does not exist")
                    prev = seen_sha[row.file] = hashlib.sha256(f.read_bytes()).hexdigest()
                if prev != row.sha256:
                    raise KernelIndexError(
                        f"{where}: {row.file} hashes to {prev}, index says {row.sha256}")
            idx._rows[row.key] = row
        return idx

    @property
    def rows(self) -> list[IndexRow]:
        return sorted(self._rows.values(), key=lambda r: r.key)

    def __iter__(self) -> Iterator[IndexRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self._rows)

    def tuned_rows(self) -> list[IndexRow]:
        return [r for r in self.rows if r.tuned]

    def get(self, arch: str, acc: str, layout: str, M: int, N: int, K: int,
            gpu: str = "") -> IndexRow | None:
        return self._rows.get((arch, acc, layout, M, N, K, gpu_key(gpu)))

    def source(self, row: IndexRow) -> str:
        """The row's kernel source (staged or on disk), checked against its sha256."""
        text = self._pending.get(row.file)
        if text is None:
            p = row.path(self.root)
            try:
                text = p.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise KernelIndexError(f"{self.index_path}: {row.label()}: kernel file {p} "
                                       "does not exist") from None
        if content_sha(text) != row.sha256:
            raise KernelIndexError(f"{self.index_path}: {row.label()}: {row.file} does not "
                                   f"match its sha256 {row.sha256}")
        return text

    # -- writing -----------------------------------------------------------------------------
    def add(self, source: str, *, arch: str, acc: str, layout: str, M: int, N: int, K: int,
            family: str = "", tuned: bool = False, mode: str = "", report: str = "",
            speedups: dict[str, float] | None = None, options=None,
            speedup_lo: float | None = None, m_bucket: str = "", gpu: str = "",
            config: str = "", verified: Iterable[str] = (), audit: int | None = None) -> IndexRow:
        """Stage `source` as the kernel for one shape on `gpu` ('' = not recorded),
        replacing that shape's row for that GPU, if any. `config`: the source's family config
        name, if it is an instantiation; `verified`: the meta fields its audit confirmed;
        `audit`: the audit version it passed (harness.audit.audited_version).

        Identical sources under one <arch>/<acc>_<layout>/ directory share one file. Nothing
        touches the disk until write().
        """
        if not isinstance(source, str) or not source.strip():
            raise KernelIndexError(f"add {arch} {acc} {layout} {M}x{N}x{K}: source is empty")
        sha = content_sha(source)
        sp = {f"speedup_{k}": (None if v is None else float(v)) for k, v in (speedups or {}).items()}
        unknown = [k for k in sp if k not in SPEEDUP_COLUMNS]
        if unknown:
            raise KernelIndexError(f"add {arch} {acc} {layout} {M}x{N}x{K}: unknown baseline(s) "
                                   f"{[k[len('speedup_'):] for k in unknown]}; known: "
                                   f"{[c[len('speedup_'):] for c in SPEEDUP_COLUMNS]}")
        gpu = gpu_key(gpu)
        key = (arch, acc, layout, M, N, K, gpu)
        subdir = f"{arch}/{acc}_{layout}"
        others = [r for k, r in self._rows.items() if k != key]
        mine = self._rows.get(key)
        # the row's own file when its source is unchanged (adding the same row again renames
        # nothing), else a file of the same source, else a new one
        file = mine.file if mine is not None and mine.sha256 == sha else next(
            (r.file for r in others if r.sha256 == sha and r.file.startswith(subdir + "/")), None)
        if file is None:
            file = f"{subdir}/{M}_{N}_{K}.cu"
            # Never overwrite a file another row still points at with a different source.
            if any(r.file == file and r.sha256 != sha for r in others):
                file = f"{subdir}/{M}_{N}_{K}-{sha[:12]}.cu"
        row = IndexRow(arch=arch, acc=acc, layout=layout, M=M, N=N, K=K, file=file, sha256=sha,
                       family=family, tuned=bool(tuned), mode=mode, report=report, **sp,
                       options=format_options(options),
                       speedup_lo=None if speedup_lo is None else float(speedup_lo),
                       m_bucket=m_bucket, gpu=gpu, config=config,
                       verified=";".join(sorted(set(
                           verified.split(";") if isinstance(verified, str) else verified) - {""})),
                       audit=audit)
        row.validate(f"add {row.label()}")
        self._rows[key] = row
        self._pending[file] = source
        return row

    def remove(self, arch: str, acc: str, layout: str, M: int, N: int, K: int,
               gpu: str = "") -> IndexRow | None:
        return self._rows.pop((arch, acc, layout, M, N, K, gpu_key(gpu)), None)

    def to_csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in self.rows:
            w.writerow(r.to_csv())
        return buf.getvalue()

    def write(self, *, prune: bool = False) -> Path:
        """Write staged sources, then index.csv, each atomically. Returns the index path.

        prune=True deletes .cu files under the root that no row references any more.
        """
        referenced = {r.file for r in self._rows.values()}
        for file, text in self._pending.items():
            if file not in referenced:
                continue  # staged, then replaced before being written
            p = self.root / file
            if p.exists() and p.read_bytes() == text.encode("utf-8"):
                continue
            _atomic_write_text(p, text)
        self._pending.clear()
        _atomic_write_text(self.index_path, self.to_csv_text())
        if self._settled:
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=SETTLED_COLUMNS, lineterminator="\n")
            w.writeheader()
            w.writerows(self._settled)
            _atomic_write_text(self.settled_path, buf.getvalue())
        if prune:
            for p in self.root.glob("*/*/*.cu"):
                if p.relative_to(self.root).as_posix() not in referenced:
                    p.unlink()
        return self.index_path

    def replace_row(self, row: IndexRow) -> None:
        """Change fields of an existing row (e.g. mark tuned after a recorded run)."""
        row.validate(f"replace {row.label()}")
        old = self._rows.get(row.key)
        if old is None:
            raise KernelIndexError(f"{self.index_path}: no row for {row.label()}")
        if (old.file, old.sha256) != (row.file, row.sha256):
            raise KernelIndexError(f"{self.index_path}: {row.label()}: replace_row cannot change "
                                   "the source; use add()")
        self._rows[row.key] = row


def with_fields(row: IndexRow, **changes) -> IndexRow:
    """dataclasses.replace with validation."""
    new = dataclasses.replace(row, **changes)
    new.validate(f"{new.label()}")
    return new


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m cudal2.core.store",
                                description="check the generated_kernels/ store (seed it with "
                                            "python -m cudal2.templates --seed-store)")
    p.add_argument("root", nargs="?", type=Path, default=None, help="store (default: CUDAL2_KERNELS)")
    args = p.parse_args(argv)
    idx = KernelIndex.load(args.root)
    tuned = len(idx.tuned_rows())
    files = len({r.file for r in idx.rows})
    print(f"{idx.index_path}: {len(idx)} rows ({tuned} tuned, {len(idx) - tuned} untuned), "
          f"{files} distinct kernel files, all present and matching their sha256")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
