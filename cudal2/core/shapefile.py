"""Reading shapes CSV files (M,N,K[,...] rows): the one rule every reader follows. Header names
are stripped (a hand-written `M, N, K`), a spreadsheet's UTF-8 BOM is not part of the first name,
and every size must fit the kernel ABI's C ints: a larger one would wrap round in the call."""
from __future__ import annotations

import csv
from pathlib import Path

INT_MAX = 2**31 - 1  # the kernel ABI's sizes and leading dimensions are C ints (docs/abi.md)


def open_csv(path):
    """The file opened for csv: utf-8-sig drops a BOM. OSError as a ValueError naming it."""
    try:
        return Path(path).open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"cannot read shape file {path}: {exc.strerror or exc}") from None


def reader(f, path, required: tuple[str, ...] = ("M", "N", "K")) -> csv.DictReader:
    """A DictReader over `f` (from open_csv) with stripped header names; ValueError naming the
    file and the columns it lacks."""
    r = csv.DictReader(f)
    r.fieldnames = [(name or "").strip() for name in r.fieldnames or ()]
    missing = sorted(set(required) - set(r.fieldnames))
    if missing:
        raise ValueError(f"{path}: header must have columns {','.join(required)} (missing {missing})")
    return r


def check_sizes(shape: tuple[int, int, int], path, line: int) -> tuple[int, int, int]:
    """`shape` if every size is in 1..INT_MAX; else a ValueError naming the row and the column."""
    for col, v in zip("MNK", shape):
        if not 1 <= v <= INT_MAX:
            raise ValueError(f"{path}:{line}: column {col}: {v} is outside 1..{INT_MAX} "
                             "(the kernel ABI's sizes are 32-bit ints)")
    return tuple(shape)
