"""Progress bars with an ETA for long commands (`campaign prepare`, `campaign run`, `tune-model`).

A bar is tqdm's, drawn only on a terminal (stdout and stderr both TTYs), only where tqdm is
installed (the `tune` extra) and never when the caller says off (`--no-progress`): logs, pipes,
tests and a bare GPU machine get exactly the per-line prints, which tools/gpu_session parses.
Imported by the commands only, never by `import cudal2`.
"""
from __future__ import annotations

import sys
from typing import Callable


def wanted(flag: bool | None = None, *streams) -> bool:
    """Whether to draw: flag False (--no-progress) is off, True on, None: on a terminal only."""
    if flag is not None:
        return flag
    streams = streams or (sys.stdout, sys.stderr)
    return all(callable(getattr(s, "isatty", None)) and s.isatty() for s in streams)


def clock(seconds: float) -> str:
    """mm:ss, or h:mm:ss from an hour (the budget left beside the bar)."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Bar:
    """total items, named desc. update() after each; log(line) prints a line above the bar
    (through `log`, the caller's printer: print unless a test passes its own)."""

    def __init__(self, total: int, desc: str, *, enabled: bool | None = None, unit: str = "it",
                 log: Callable = print, stream=None):
        stream = stream or sys.stderr
        self._log = log
        self._tqdm = _tqdm(int(total), desc, unit, stream) if wanted(enabled, sys.stdout, stream) else None

    @property
    def enabled(self) -> bool:
        return self._tqdm is not None

    def update(self, n: int = 1) -> None:
        if self._tqdm is not None:
            self._tqdm.update(n)

    def postfix(self, note: str) -> None:
        """A short note after the ETA (e.g. the budget left)."""
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(note, refresh=True)

    def log(self, line: str) -> None:
        if self._tqdm is not None and self._log is print:
            self._tqdm.write(line, file=sys.stdout)   # above the bar, whole
        else:
            self._log(line)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tqdm(total: int, desc: str, unit: str, stream):
    """A tqdm bar (ETA included), or None when tqdm is not installed: no bar, the lines only."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=False)
