"""The results database: SQLite, WAL, append-only, schema versioned.

One row per evaluation (an `Evaluation`), committed on its own, so a killed process loses at
most the evaluation in flight and a rerun resumes by skipping what the harness's cache rule
(cudal2.harness.pipeline.answers) finds. The harness is the only writer of evaluation rows. Sources are
stored once, keyed by sha256. Evaluation rows are never rewritten: triggers refuse UPDATE and
DELETE (history is the point: a kernel that was once fast and later wrong stays on record).

Schema changes go in MIGRATIONS (append only); `ResultsDB` applies the missing ones on open.
"""
from __future__ import annotations

import gzip
import json
import math
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

from cudal2.core.binarykey import KEY_VERSION
from cudal2.harness.types import Evaluation, Shape, normalise_options

SCHEMA_VERSION = 4

# Each entry upgrades the schema from version i to i + 1. Never edit a shipped entry.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sources (
        sha256   TEXT PRIMARY KEY,
        text     TEXT NOT NULL,
        created  TEXT NOT NULL
    );
    CREATE TABLE evaluations (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        source_sha   TEXT NOT NULL REFERENCES sources(sha256),
        M            INTEGER NOT NULL,
        N            INTEGER NOT NULL,
        K            INTEGER NOT NULL,
        arch         TEXT NOT NULL,
        acc          TEXT NOT NULL,
        layout       TEXT NOT NULL,
        status       TEXT NOT NULL,
        detail       TEXT NOT NULL DEFAULT '',
        gpu          TEXT NOT NULL DEFAULT '',       -- '' when no GPU measured it
        origin       TEXT NOT NULL DEFAULT '',
        build_status TEXT,
        registers    INTEGER,
        shared_bytes INTEGER,
        spills       INTEGER,
        audit_ok     INTEGER,
        correct      INTEGER,
        max_abs_err  REAL,
        max_rel_err  REAL,
        median_us    REAL,                           -- candidate, offline mode (NULL if none)
        best_speedup REAL,                           -- vs the fastest baseline, offline mode
        estimated    INTEGER NOT NULL DEFAULT 0,
        driver       TEXT,
        sm_clock_mhz REAL,
        temp_c       REAL,
        torch        TEXT,
        nvcc         TEXT,
        git_commit   TEXT,
        hostname     TEXT,
        created      TEXT NOT NULL,
        build        TEXT NOT NULL,                  -- JSON objects, as in Evaluation
        audit        TEXT NOT NULL,
        correctness  TEXT NOT NULL,
        timings      TEXT NOT NULL,
        speedups     TEXT NOT NULL,
        env          TEXT NOT NULL,
        meta         TEXT NOT NULL
    );
    CREATE INDEX evaluations_lookup ON evaluations (source_sha, M, N, K, arch, gpu);
    CREATE INDEX evaluations_shape ON evaluations (M, N, K, arch, gpu, status);
    CREATE TRIGGER evaluations_no_update BEFORE UPDATE ON evaluations
        BEGIN SELECT RAISE(ABORT, 'results DB is append-only: evaluations are never updated'); END;
    CREATE TRIGGER evaluations_no_delete BEFORE DELETE ON evaluations
        BEGIN SELECT RAISE(ABORT, 'results DB is append-only: evaluations are never deleted'); END;
    CREATE TRIGGER sources_no_update BEFORE UPDATE ON sources
        BEGIN SELECT RAISE(ABORT, 'results DB is append-only: sources are never updated'); END;
    CREATE TRIGGER sources_no_delete BEFORE DELETE ON sources
        BEGIN SELECT RAISE(ABORT, 'results DB is append-only: sources are never deleted'); END;
    """,
    # 2: kernel time. Rows record the runtime options they were called with, the stage
    # (screen | final), the timer, the intervals and sessions (stats), the lower end of the
    # offline speedup interval against the best baseline; cuBLASLt autotune choices per key.
    """
    ALTER TABLE evaluations ADD COLUMN options TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE evaluations ADD COLUMN stage TEXT NOT NULL DEFAULT 'final';
    ALTER TABLE evaluations ADD COLUMN timer TEXT NOT NULL DEFAULT '';
    ALTER TABLE evaluations ADD COLUMN speedup_lo REAL;
    ALTER TABLE evaluations ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
    CREATE INDEX evaluations_options ON evaluations (source_sha, M, N, K, arch, gpu, options);
    CREATE TABLE baseline_choices (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        key      TEXT NOT NULL,                      -- baselines.autotune_key
        entry    TEXT NOT NULL,                      -- JSON: index, algos, median_us, timer, ...
        created  TEXT NOT NULL
    );
    CREATE INDEX baseline_choices_key ON baseline_choices (key);
    CREATE TRIGGER baseline_choices_no_update BEFORE UPDATE ON baseline_choices
        BEGIN SELECT RAISE(ABORT, 'results DB is append-only: choices are never updated'); END;
    """,
    # 3: binary keys (cudal2.core.binarykey). New rows carry theirs; rows recorded before get
    # theirs from binary_keys, filled by rebuilding the stored source (cudal2 db backfill-keys).
    """
    ALTER TABLE evaluations ADD COLUMN binary_key TEXT;
    CREATE TABLE binary_keys (
        source_sha TEXT NOT NULL,
        arch       TEXT NOT NULL,
        nvcc       TEXT NOT NULL,
        binary_key TEXT NOT NULL,
        how        TEXT NOT NULL,                    -- how the key was obtained (e.g. rebuilt)
        created    TEXT NOT NULL,
        PRIMARY KEY (source_sha, arch, nvcc)
    );
    """,
    # 4: the version of each binary key (cudal2.core.binarykey.KEY_VERSION). A key of another
    # version was normalised differently and names no binary today: it reads as no key, and the
    # backfill records today's in its place.
    """
    ALTER TABLE evaluations ADD COLUMN binary_key_version INTEGER;
    ALTER TABLE binary_keys ADD COLUMN key_version INTEGER NOT NULL DEFAULT 1;
    """,
)
assert len(MIGRATIONS) == SCHEMA_VERSION

_JSON_COLS = ("build", "audit", "correctness", "timings", "speedups", "env", "meta", "options",
              "stats")
_FILTERS = {"source_sha", "M", "N", "K", "arch", "acc", "layout", "status", "gpu", "origin",
            "estimated", "stage", "options"}


def options_key(options) -> str:
    """The canonical JSON of a row's runtime options (what the `options` column holds)."""
    return json.dumps(dict(normalise_options(options)), sort_keys=True)


class DBError(RuntimeError):
    """The DB file cannot be used (newer schema, not a results DB)."""


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_schema(con: sqlite3.Connection, path: Path) -> None:
    """DBError unless `con` holds a results DB's tables."""
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "schema_version" not in tables or not {"sources", "evaluations"} <= tables:
        raise DBError(f"{path}: not a usable results DB (an SQLite file of another schema, "
                      f"tables: {', '.join(sorted(tables)[:8]) or 'none'}); left as it is")


def _refuse_foreign(path: Path) -> None:
    """Raise DBError, before anything opens `path` for writing, when the file is not ours to
    write: not an SQLite file, an SQLite file of another schema, or a results DB of a newer
    schema. Opening it writable would change it (WAL mode rewrites the header, the migrations
    add tables), so the checks read it only (an empty file or an SQLite file without tables is
    a new DB)."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as e:
        raise DBError(f"{path}: cannot read the results DB ({e.strerror or e})") from None
    if not head:
        return
    if head != _SQLITE_MAGIC:
        raise DBError(f"{path}: not a usable results DB (not an SQLite file); left as it is")
    live = Path(f"{path}-wal").exists()
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("" if live else "&immutable=1")
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise DBError(f"{path}: not a usable results DB ({e}); left as it is") from None
    try:
        if not con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            return
        _check_schema(con, path)
        have = con.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
    except sqlite3.Error as e:
        raise DBError(f"{path}: not a usable results DB ({e}); left as it is") from None
    finally:
        con.close()
    if have > SCHEMA_VERSION:
        raise DBError(f"{path}: schema version {have} is newer than this cudal2 "
                      f"({SCHEMA_VERSION}); upgrade cudal2 (the file is left as it is)")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


class ResultsDB:
    """Append-only results store. Safe for several processes (WAL) and threads (one lock)."""

    def __init__(self, path: str | Path, *, timeout: float = 60.0, readonly: bool = False):
        """readonly=True: read a DB as it is (a committed report's), never migrated or written;
        rows of an older schema read with the newer fields at their defaults. A gzipped DB
        (`results.db.gz`, how large committed reports are kept) opens read-only, in memory."""
        self.path = Path(path)
        self._lock = threading.RLock()
        # seconds this object spent writing (add: encoding the row and its transaction;
        # add_baseline_choice; waits for the lock and SQLite's busy wait included), cumulative,
        # so a campaign can attribute its DB time
        self.write_seconds = 0.0
        self._thread = threading.local()          # the same, per writing thread
        if self.path.suffix == ".gz":
            readonly = True
        self.readonly = readonly
        if readonly:
            if not self.path.is_file():
                raise DBError(f"{path}: no such results DB")
            if self.path.suffix == ".gz":
                self._conn = self._open_gzipped(timeout)
            else:
                # a closed DB (no -wal file: a committed report's) opens immutable, so reading
                # it leaves no -shm/-wal files behind; a live one (a run still writing) read-only
                live = Path(f"{self.path}-wal").exists()
                uri = f"file:{self.path}?mode=ro" + ("" if live else "&immutable=1")
                self._conn = sqlite3.connect(uri, uri=True, timeout=timeout,
                                             check_same_thread=False, isolation_level=None)
            self._conn.row_factory = sqlite3.Row
            try:
                _check_schema(self._conn, self.path)
                self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            except sqlite3.DatabaseError as e:
                self._conn.close()
                raise DBError(f"{path}: not a usable results DB ({e})") from None
            except DBError:
                self._conn.close()
                raise
            return
        if str(path) != ":memory:":
            _refuse_foreign(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), timeout=timeout, check_same_thread=False,
                                     isolation_level=None)     # explicit transactions below
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")    # WAL + NORMAL: a commit survives a process kill
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise DBError(f"{path}: not a usable results DB ({e})") from None

    def _open_gzipped(self, timeout: float) -> sqlite3.Connection:
        try:
            data = gzip.decompress(self.path.read_bytes())
        except (OSError, EOFError) as e:
            raise DBError(f"{self.path}: not a gzipped results DB ({e})") from None
        conn = sqlite3.connect(":memory:", timeout=timeout, check_same_thread=False,
                               isolation_level=None)
        if not hasattr(conn, "deserialize"):      # Python 3.10
            conn.close()
            raise DBError(f"{self.path}: reading a gzipped DB needs Python >= 3.11; "
                          f"gunzip -k it and open the .db")
        if data[:16] == b"SQLite format 3\x00" and data[18:20] == b"\x02\x02":
            # a WAL-mode file (as runs write them) cannot be read from memory: mark it as a
            # rollback-journal file, which it is once closed (its WAL was checkpointed)
            data = data[:18] + b"\x01\x01" + data[20:]
        try:
            conn.deserialize(data)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise DBError(f"{self.path}: not a usable results DB ({e})") from None
        conn.execute("PRAGMA query_only = ON")    # read-only like a committed file DB
        return conn

    # -- schema
    def _migrate(self) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("CREATE TABLE IF NOT EXISTS schema_version "
                                   "(version INTEGER NOT NULL, applied TEXT NOT NULL)")
                row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
                have = row[0] or 0
                if have > SCHEMA_VERSION:
                    raise DBError(f"{self.path}: schema version {have} is newer than this cudal2 "
                                  f"({SCHEMA_VERSION}); upgrade cudal2")
                for v in range(have, SCHEMA_VERSION):
                    for stmt in _statements(MIGRATIONS[v]):
                        self._conn.execute(stmt)
                    self._conn.execute("INSERT INTO schema_version VALUES (?, datetime('now'))", (v + 1,))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]

    # -- writing
    @contextmanager
    def _timed_write(self, t0: float):
        """Adds the seconds since t0 (taken before the lock) to write_seconds, under the lock."""
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.write_seconds += dt
            self._thread.seconds = getattr(self._thread, "seconds", 0.0) + dt

    def thread_write_seconds(self) -> float:
        """write_seconds spent by the calling thread alone (a campaign lane's own share)."""
        return getattr(self._thread, "seconds", 0.0)

    def add(self, ev: Evaluation, source: str | None = None) -> int:
        """Append one evaluation (and its source, if given and new); one transaction. Returns
        the row id (also set on `ev.id`)."""
        t0 = time.perf_counter()                    # write_seconds: encoding included
        b, a, c, env = ev.build or {}, ev.audit or {}, ev.correctness or {}, ev.env or {}
        off = (ev.timings or {}).get("offline", {})
        median = _num((off.get("candidate") or {}).get("median_us"))
        sp = [s for s in ((ev.speedups or {}).get("offline") or {}).values() if _num(s)]
        ivs = (((ev.stats or {}).get("offline") or {}).get("speedup") or {})
        los = [_num(iv.get("lo")) for b, iv in ivs.items() if isinstance(iv, dict)
               and b in (ev.speedups or {}).get("offline", {})]
        los = [x for x in los if x is not None]
        row = {
            "source_sha": ev.source_sha, "M": ev.shape.M, "N": ev.shape.N, "K": ev.shape.K,
            "arch": ev.arch, "acc": ev.acc or "", "layout": ev.layout or "", "status": ev.status,
            "detail": ev.detail or "", "gpu": env.get("gpu") or "", "origin": ev.origin or "",
            "build_status": b.get("status"), "registers": b.get("registers"),
            "shared_bytes": b.get("shared_bytes"), "spills": b.get("spills"),
            "audit_ok": None if "ok" not in a else int(bool(a["ok"])),
            "correct": None if "ok" not in c else int(bool(c["ok"])),
            "max_abs_err": _num(c.get("max_abs_err")), "max_rel_err": _num(c.get("max_rel_err")),
            "median_us": median, "best_speedup": min(sp) if sp else None,
            "estimated": int(bool(ev.estimated)), "driver": env.get("driver"),
            "sm_clock_mhz": _num(env.get("sm_clock_mhz")), "temp_c": _num(env.get("temp_c")),
            "torch": env.get("torch"), "nvcc": env.get("nvcc"), "git_commit": env.get("git_commit"),
            "hostname": env.get("hostname"), "created": ev.created,
            "stage": ev.stage, "timer": str((env.get("settings") or {}).get("timer") or ""),
            "speedup_lo": min(los) if los else None, "binary_key": ev.binary_key,
            "binary_key_version": KEY_VERSION if ev.binary_key else None,
        }
        for col in _JSON_COLS:
            row[col] = json.dumps(getattr(ev, col) or {}, sort_keys=True, default=str)
        row["options"] = options_key(ev.options)
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self._lock, self._timed_write(t0):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if source is not None:
                    self._conn.execute("INSERT OR IGNORE INTO sources VALUES (?, ?, datetime('now'))",
                                       (ev.source_sha, source))
                elif not self._conn.execute("SELECT 1 FROM sources WHERE sha256 = ?",
                                            (ev.source_sha,)).fetchone():
                    raise ValueError(f"source {ev.source_sha[:12]} is not in the DB: pass source=")
                cur = self._conn.execute(f"INSERT INTO evaluations ({cols}) VALUES ({marks})",
                                         tuple(row.values()))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        ev.id = cur.lastrowid
        return ev.id

    # -- reading
    def _to_eval(self, r: sqlite3.Row) -> Evaluation:
        cols = r.keys()                 # a read-only DB of an older schema lacks newer columns
        d = {k: json.loads(r[k]) for k in _JSON_COLS if k in cols}
        key = r["binary_key"] if "binary_key" in cols else None        # recorded with the row
        version = r["binary_key_version"] if "binary_key_version" in cols else 1
        key = key if version == KEY_VERSION else None                   # another version's: none
        key = key or (r["backfilled_key"] if "backfilled_key" in cols else None)
        return Evaluation(status=r["status"], source_sha=r["source_sha"],
                          shape=Shape(r["M"], r["N"], r["K"]), arch=r["arch"], acc=r["acc"],
                          layout=r["layout"], estimated=bool(r["estimated"]), created=r["created"],
                          origin=r["origin"], detail=r["detail"], id=r["id"],
                          stage=r["stage"] if "stage" in cols else "final", binary_key=key, **d)

    def _key_version_sql(self, alias: str = "binary_keys") -> str:
        """The binary_keys key-version expression: its column, or 1 in a DB of schema 3."""
        cols = {r[1] for r in self._conn.execute("PRAGMA table_info(binary_keys)")}
        return f"{alias}.key_version" if "key_version" in cols else "1"

    def _has_table(self, name: str) -> bool:
        return bool(self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                       "AND name = ?", (name,)).fetchone())

    def add_binary_key(self, source_sha: str, arch: str, nvcc: str, binary_key: str,
                       how: str) -> bool:
        """Record the binary key (this KEY_VERSION) of a stored source built for (arch, nvcc),
        for the rows recorded before keys: the first record of a version stands, a key of
        another version is replaced. True if it was new."""
        t0 = time.perf_counter()
        with self._lock, self._timed_write(t0):
            cur = self._conn.execute(
                "INSERT INTO binary_keys (source_sha, arch, nvcc, binary_key, how, created, key_version) "
                "VALUES (?, ?, ?, ?, ?, datetime('now'), ?) ON CONFLICT (source_sha, arch, nvcc) DO UPDATE "
                "SET binary_key = excluded.binary_key, how = excluded.how, created = excluded.created, "
                "key_version = excluded.key_version WHERE binary_keys.key_version != excluded.key_version",
                (source_sha, arch, nvcc, binary_key, how, KEY_VERSION))
        return cur.rowcount == 1

    def binary_keys(self) -> dict[tuple[str, str, str], str]:
        """{(source_sha, arch, nvcc): binary key} as backfilled, this KEY_VERSION's only (empty
        before schema 3)."""
        with self._lock:
            if not self._has_table("binary_keys"):
                return {}
            rows = self._conn.execute("SELECT source_sha, arch, nvcc, binary_key FROM binary_keys "
                                      f"WHERE {self._key_version_sql()} = ?", (KEY_VERSION,)).fetchall()
        return {(r[0], r[1], r[2]): r[3] for r in rows}

    def add_baseline_choice(self, key: str, entry: dict) -> None:
        """Record a cuBLASLt autotune choice (baselines.autotune_key -> entry); the latest per
        key answers (baseline_choices)."""
        t0 = time.perf_counter()
        with self._lock, self._timed_write(t0):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("INSERT INTO baseline_choices (key, entry, created) "
                                   "VALUES (?, ?, datetime('now'))",
                                   (key, json.dumps(entry, sort_keys=True, default=str)))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def baseline_choices(self) -> dict[str, dict]:
        """{autotune key: the latest entry recorded for it}."""
        return dict(self.baseline_choice_log())

    def baseline_choice_log(self) -> list[tuple[str, dict]]:
        """Every (autotune key, entry) recorded, oldest first."""
        with self._lock:
            try:
                rows = self._conn.execute("SELECT key, entry FROM baseline_choices ORDER BY id").fetchall()
            except sqlite3.OperationalError:       # a read-only DB of schema 1
                return []
        return [(r["key"], json.loads(r["entry"])) for r in rows]

    def rows(self, *, limit: int | None = None, **filters) -> list[Evaluation]:
        """Evaluations matching column filters (source_sha, M, N, K, arch, acc, layout, status,
        gpu, origin, estimated, stage, options; a list/tuple value means IN), oldest first."""
        where, args = [], []
        for k, v in filters.items():
            if k == "shape":
                for name, x in zip("MNK", (v.M, v.N, v.K)):
                    where.append(f"e.{name} = ?")
                    args.append(x)
                continue
            if k not in _FILTERS:
                raise ValueError(f"unknown filter {k!r}; known: {sorted(_FILTERS | {'shape'})}")
            if k == "options":
                v = options_key(v)
            if isinstance(v, (list, tuple, set, frozenset)):
                where.append(f"e.{k} IN ({', '.join('?' for _ in v)})")
                args.extend(v)
            else:
                where.append(f"e.{k} = ?")
                args.append(int(v) if isinstance(v, bool) else v)
        with self._lock:
            sql = "SELECT e.* FROM evaluations e"
            if self._has_table("binary_keys"):      # rows recorded before keys: the backfill's
                sql = ("SELECT e.*, k.binary_key AS backfilled_key FROM evaluations e "
                       "LEFT JOIN binary_keys k ON k.source_sha = e.source_sha "
                       f"AND k.arch = e.arch AND k.nvcc = e.nvcc AND {self._key_version_sql('k')} = "
                       f"{int(KEY_VERSION)}")
            sql += (" WHERE " + " AND ".join(where) if where else "")
            sql += " ORDER BY e.id" + (f" LIMIT {int(limit)}" if limit else "")
            return [self._to_eval(r) for r in self._conn.execute(sql, args).fetchall()]

    def source(self, sha: str) -> str | None:
        with self._lock:
            r = self._conn.execute("SELECT text FROM sources WHERE sha256 = ?", (sha,)).fetchone()
        return r[0] if r else None

    def count(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]

    def backup_to(self, dest) -> None:
        """A consistent copy of this DB as one self-contained file (rollback journal, not WAL:
        no -wal/-shm files beside it), e.g. a snapshot that must stay usable if the writer dies."""
        with self._lock:
            with sqlite3.connect(str(dest)) as out:
                self._conn.backup(out)
                out.execute("PRAGMA journal_mode=DELETE")
            out.close()

    def to_dataframe(self, **filters):
        """A pandas DataFrame: the scalar columns plus flattened timings
        (`<mode>_<who>_median_us`) and speedups (`speedup_<mode>_<baseline>`)."""
        import pandas as pd
        recs = []
        for ev in self.rows(**filters):
            rec: dict[str, Any] = {
                "id": ev.id, "source_sha": ev.source_sha, "M": ev.shape.M, "N": ev.shape.N,
                "K": ev.shape.K, "arch": ev.arch, "acc": ev.acc, "layout": ev.layout,
                "status": ev.status, "detail": ev.detail, "origin": ev.origin,
                "estimated": ev.estimated, "created": ev.created,
                "audit_ok": ev.audit.get("ok"), "correct": ev.correctness.get("ok"),
                "max_abs_err": ev.correctness.get("max_abs_err"),
                "registers": ev.build.get("registers"), "shared_bytes": ev.build.get("shared_bytes"),
                "spills": ev.build.get("spills"),
            }
            for k in ("gpu", "driver", "sm_clock_mhz", "temp_c", "torch", "nvcc", "git_commit"):
                rec[k] = ev.env.get(k)
            for mode, whos in (ev.timings or {}).items():
                for who, t in whos.items():
                    rec[f"{mode}_{who}_median_us"] = (t or {}).get("median_us")
            for mode, sps in (ev.speedups or {}).items():
                for base, s in sps.items():
                    rec[f"speedup_{mode}_{base}"] = s
            recs.append(rec)
        return pd.DataFrame.from_records(recs)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _statements(script: str) -> Iterable[str]:
    """Split a migration into statements (triggers contain ';' inside BEGIN ... END)."""
    buf = ""
    for line in script.strip().splitlines():
        buf += line + "\n"
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf.strip()
            buf = ""
    if buf.strip():
        yield buf.strip()
