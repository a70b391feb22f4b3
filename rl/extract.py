"""Pull the kernel file out of a policy completion.

A completion may be a string or a chat message list (trl's conversational format). The kernel
file is the one fenced code block, or the whole text when there is no fence. Verdicts:

- ``ok``         one file that speaks our ABI: it defines ``cudal2_hgemm`` and ``cudal2_meta``,
                 or it includes one of our template headers (``#include "mma_hgemm.cuh"``), which
                 define both.
- ``no_code``    nothing that looks like C/C++ (empty, prose only).
- ``two_files``  more than one kernel file (two fenced kernels, or two entry points in one text):
                 we never guess which one the policy meant.
- ``not_abi``    code, but neither our entry points nor a recognised template include.

Extraction never builds or runs anything; it is pure text handling.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

OK = "ok"
NO_CODE = "no_code"
TWO_FILES = "two_files"
NOT_ABI = "not_abi"
VERDICTS = (OK, NO_CODE, TWO_FILES, NOT_ABI)

# An opening fence with an optional language tag; the closing fence may be missing when the
# completion was cut at max length.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)",
                    re.S | re.M)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)
_ENTRY = re.compile(r"\bcudal2_hgemm[ \t\n]*\(")
_META = re.compile(r"\bcudal2_meta\b")
_CODE_HINT = re.compile(r"[;{}#]")


@dataclass(frozen=True)
class Extraction:
    verdict: str
    source: str = ""          # the kernel file text ("" unless there is code)
    detail: str = ""          # one line saying why, for logs and feedback prompts

    @property
    def ok(self) -> bool:
        return self.verdict == OK


@lru_cache(maxsize=1)
def template_headers() -> frozenset[str]:
    """The header file names our template families ship (data files in cudal2/templates/)."""
    import cudal2
    root = Path(cudal2.__file__).resolve().parent / "templates"
    return frozenset(p.name for p in root.glob("*.cuh"))


def completion_text(completion) -> str:
    """A completion as text: str as is; a message list -> its last assistant content."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        msgs = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in msgs if m.get("role") == "assistant"] or msgs
        return str(assistant[-1].get("content") or "") if assistant else ""
    raise TypeError(f"completion must be str or a list of messages, got {type(completion).__name__}")


def _template_includes(text: str, headers: frozenset[str]) -> list[str]:
    return [h for h in _INCLUDE.findall(text) if Path(h).name in headers]


def _kernel_like(text: str, headers: frozenset[str]) -> bool:
    return bool(_ENTRY.search(text)) or bool(_template_includes(text, headers))


def extract(completion, *, headers: frozenset[str] | None = None) -> Extraction:
    """The kernel file in `completion`, with a verdict (see the module docstring)."""
    headers = template_headers() if headers is None else headers
    text = completion_text(completion)
    if not text.strip():
        return Extraction(NO_CODE, detail="empty completion")
    blocks = [body for _lang, body in _FENCE.findall(text) if body.strip()]
    if blocks:
        kernels = [b for b in blocks if _kernel_like(b, headers)]
        if len(kernels) > 1:
            return Extraction(TWO_FILES, kernels[0],
                              f"{len(kernels)} fenced kernel files; answer with exactly one")
        source = kernels[0] if kernels else blocks[0]
    else:
        source = text
    if not _CODE_HINT.search(source):
        return Extraction(NO_CODE, detail="no C/C++ code in the completion")
    entries = len(_ENTRY.findall(source))
    includes = _template_includes(source, headers)
    if entries > 1 or len(includes) > 1 or (entries and includes):
        return Extraction(TWO_FILES, source,
                          "more than one kernel in one file (entry points or template includes)")
    if includes:
        return Extraction(OK, source.strip() + "\n", f"template {Path(includes[0]).name}")
    if entries and _META.search(source):
        return Extraction(OK, source.strip() + "\n", "raw kernel")
    missing = [n for n, ok in (("cudal2_hgemm", entries), ("cudal2_meta", _META.search(source)))
               if not ok]
    return Extraction(NOT_ABI, source.strip() + "\n",
                      f"missing {' and '.join(missing)} and no template include "
                      f"(known: {', '.join(sorted(headers)) or 'none'})")
