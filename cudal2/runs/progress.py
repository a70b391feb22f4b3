"""Progress bars with an ETA for long commands (`campaign prepare`, `campaign run`, `tune-model`).

A bar shows only on a terminal (stdout and stderr both TTYs) and never when the caller says
off (`--no-progress`): logs, pipes and tests get exactly the per-line prints they got before,
which tools/gpu_session parses. Drawn by tqdm when it is installed (the `tune` extra; not a
dependency of torch), else by a small stdlib line, so the GPU machine, which needs only torch
and numpy, shows one too. Imported by the commands only, never by `import cudal2`.
"""
from __future__ import annotations

import sys
import time
from typing import Callable


def wanted(flag: bool | None = None, *streams) -> bool:
    """Whether to draw: flag False (--no-progress) is off, True on, None: on a terminal only."""
    if flag is not None:
        return flag
    streams = streams or (sys.stdout, sys.stderr)
    return all(callable(getattr(s, "isatty", None)) and s.isatty() for s in streams)


def eta_s(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left at the mean rate so far; None before the first item (no rate yet)."""
    if done <= 0 or total <= 0:
        return None
    return max(0.0, elapsed_s / done * (total - done))


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Bar:
    """total items, named desc. update() after each; log(line) prints a line above the bar
    (through `log`, the caller's printer: print unless a test passes its own)."""

    def __init__(self, total: int, desc: str, *, enabled: bool | None = None, unit: str = "it",
                 log: Callable = print, stream=None):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream = stream or sys.stderr
        self.enabled = wanted(enabled, sys.stdout, self.stream)
        self.done, self.note = 0, ""
        self._log, self._start, self._tqdm, self._width = log, time.monotonic(), None, 0
        if self.enabled:
            self._tqdm = _tqdm(self.total, desc, unit, self.stream)
            self._draw()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._tqdm is not None:
            self._tqdm.update(n)
        else:
            self._draw()

    def postfix(self, note: str) -> None:
        """A short note after the ETA (e.g. the budget left)."""
        self.note = note
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(note, refresh=True)
        else:
            self._draw()

    def log(self, line: str) -> None:
        if not self.enabled or self._log is not print:
            self._log(line)
        elif self._tqdm is not None:
            self._tqdm.write(line, file=sys.stdout)
        else:
            self._clear()
            print(line, flush=True)
            self._draw()

    def line(self) -> str:
        """The stdlib bar's text: desc, count, percent, elapsed, ETA, note."""
        elapsed = time.monotonic() - self._start
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = (f"{self.desc}: {self.done}/{self.total} {self.unit} {pct:3.0f}% "
                f"[{clock(elapsed)} elapsed, ETA {clock(eta_s(self.done, self.total, elapsed))}]")
        return f"{text} {self.note}" if self.note else text

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
        elif self.enabled:
            self._clear()
        self.enabled = False

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _draw(self) -> None:
        if self.enabled and self._tqdm is None:
            text = self.line()
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = len(text)

    def _clear(self) -> None:
        self.stream.write("\r" + " " * self._width + "\r")
        self.stream.flush()


def _tqdm(total: int, desc: str, unit: str, stream):
    """A tqdm bar, or None when tqdm is not installed (the stdlib line draws instead)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=False)
