"""The table dispatch serves: the shipped table with the user's own table layered over it.

* shipped: knobs.kernels_dir() (CUDAL2_KERNELS), installed with the package; a pip upgrade
  replaces it.
* user: knobs.user_kernels_dir() (CUDAL2_USER_KERNELS, default <CUDAL2_CACHE>/kernels), where
  `cudal2 export` and `cudal2 campaign run` write by default; outside the package, so an upgrade
  never erases it. Absent = empty.

Only tuned rows are layered (untuned seeds never serve). Per row key (arch, acc, layout, M, N,
K, gpu) the row with the higher `speedup_lo` (the export rule's own figure: the lower end of the
kernel-time speedup interval against the fastest baseline) serves; a row without the figure
loses to one with it; a tie goes to the user's row (its owner exported it on purpose). The other
row is kept as `shadowed`, so nothing measured disappears from view. Every row remembers its
table, so its source (and a carried binary) is read under that table's root. A table that does
not read is left out with a one-line problem naming its file; the other still serves.

A row serves only when its kernel passed the current audit (vocab.AUDIT_VERSION, index column
`audit`): a row audited under older rules (before stream discipline: a kernel that launches off
the caller's stream races every user on a stream of their own) or whose calls the call guard
never watched is kept as `unaudited` and serves nothing, whatever its speed, until `cudal2
reaudit` audits its kernel again; the other table's row of its key serves meanwhile, or torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cudal2.core import knobs
from cudal2.core.store import IndexRow, KernelIndex, KernelIndexError
from cudal2.core.vocab import AUDIT_VERSION

SHIPPED, USER = "shipped", "user"


@dataclass(frozen=True)
class Shadowed:
    row: IndexRow     # the row that does not serve
    table: str        # its table (SHIPPED or USER)
    by: str           # the table whose row of the same key serves instead


@dataclass(frozen=True)
class Unaudited:
    row: IndexRow     # a tuned row whose kernel did not pass the current audit
    table: str        # its table (SHIPPED or USER)


def audit_current(row: IndexRow) -> bool:
    """Whether the row's kernel passed the audit of this cudal2 (AUDIT_VERSION)."""
    return row.audit_version >= AUDIT_VERSION


def why_unaudited(u: Unaudited, root: Path) -> str:
    """One line: why an unaudited row does not serve, and the command that fixes it."""
    was = (f"audited under rules v{u.row.audit_version}" if u.row.audit_version
           else "its calls were never watched by the call guard")
    return (f"{was}, this cudal2 needs v{AUDIT_VERSION} (launches on the caller's stream only): "
            f"not served until `cudal2 reaudit --table {root}`")


def wins(new: IndexRow, old: IndexRow) -> bool:
    """Whether `new` (a later layer's row) replaces `old` for one key: higher speedup_lo, a
    number beats none, a tie goes to the later layer."""
    if new.speedup_lo is None:
        return old.speedup_lo is None
    return old.speedup_lo is None or new.speedup_lo >= old.speedup_lo


class Tables:
    """The layered serving table: `rows` (key -> tuned IndexRow) and where each came from."""

    def __init__(self, indexes: dict[str, KernelIndex], problems=()):
        self.indexes = indexes            # table name -> its index, lowest layer first
        self.problems = list(problems)    # one line per table that did not read
        self.rows: dict[tuple, IndexRow] = {}
        self.origin: dict[tuple, str] = {}
        self.shadowed: list[Shadowed] = []
        self.unaudited: list[Unaudited] = []
        for name, idx in indexes.items():
            for row in idx.tuned_rows():
                if audit_current(row):
                    self._layer(row, name)
                else:
                    self.unaudited.append(Unaudited(row, name))

    def _layer(self, row: IndexRow, name: str) -> None:
        old = self.rows.get(row.key)
        if old is not None and not wins(row, old):
            self.shadowed.append(Shadowed(row, name, self.origin[row.key]))
            return
        if old is not None:
            self.shadowed.append(Shadowed(old, self.origin[row.key], name))
        self.rows[row.key] = row
        self.origin[row.key] = name

    def table_of(self, row: IndexRow) -> str:
        """SHIPPED or USER: the table a serving row comes from."""
        return self.origin[row.key]

    def root_of(self, row: IndexRow) -> Path:
        return self.indexes[self.table_of(row)].root

    def source(self, row: IndexRow) -> str:
        """The serving row's kernel source, read under its own table's root (sha256 checked)."""
        return self.indexes[self.table_of(row)].source(row)


def table_roots(shipped=None, user=None) -> dict[str, Path]:
    """{SHIPPED: root, USER: root}; one entry when both name one folder (a maintainer who points
    CUDAL2_USER_KERNELS at the repository's generated_kernels/)."""
    roots = {SHIPPED: Path(shipped or knobs.kernels_dir()), USER: Path(user or knobs.user_kernels_dir())}
    if roots[SHIPPED].expanduser().resolve() == roots[USER].expanduser().resolve():
        del roots[USER]
    return roots


def load_tables(shipped=None, user=None, *, verify: bool = True) -> Tables:
    """Read both tables (default: knobs.kernels_dir() and knobs.user_kernels_dir()) and layer
    them. A table that does not read is left out, named in `problems`; the other still serves."""
    indexes: dict[str, KernelIndex] = {}
    problems: list[str] = []
    for name, root in table_roots(shipped, user).items():
        try:
            indexes[name] = KernelIndex.load(root, verify=verify)
        except (KernelIndexError, OSError, UnicodeDecodeError) as exc:
            # a broken user table must not take the shipped one down (nor the reverse)
            problems.append(f"ignoring the kernel table {root / 'index.csv'} ({name}): {exc}")
    return Tables(indexes, problems)
