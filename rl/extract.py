"""Pull the kernel file out of a policy completion.

A completion may be a string or a chat message list (trl's conversational format). What real
models write is taken as ONE kernel file:

- a reasoning block first (``<think>...</think>``, ``<thinking>``, ``<reasoning>``) is dropped,
  drafts inside it included; a completion cut off inside its reasoning has no code;
- the kernel is the one fenced code block that holds a kernel (a definition of
  ``cudal2_hgemm`` or a template include); other blocks (a build command, a usage snippet that
  calls or declares the entry point) and the prose around them are ignored; the final fence may
  be unterminated (the completion was cut at max length);
- without a fence, the whole text, with leading and trailing prose lines trimmed;
- entry points are counted as *definitions* (``cudal2_hgemm(...) {``) in code with comments and
  string literals removed: a forward declaration (as the prompt's ABI section shows), a call, a
  comment or a meta string naming ``cudal2_hgemm`` is not a second kernel. The same kernel
  repeated in two blocks is one kernel.

Verdicts:

- ``ok``         one file that speaks our ABI: it defines ``cudal2_hgemm`` and names
                 ``cudal2_meta``, or it includes one of our template headers
                 (``#include "mma_hgemm.cuh"``), which define both; or it includes a header
                 whose name is close to a template header's (``"mma_hgem.cuh"``): a misspelt
                 header is the compiler's verdict (a build error), not ours.
- ``no_code``    nothing that looks like C/C++ (empty, prose only, reasoning never finished).
- ``two_files``  more than one different kernel (two fenced kernels, two entry-point
                 definitions or two template includes in one text): we never guess which one
                 the policy meant.
- ``not_abi``    code, but neither our entry point's definition nor a (recognisable) template
                 include.

Extraction never builds or runs anything; it is pure text handling.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cudal2

OK = "ok"
NO_CODE = "no_code"
TWO_FILES = "two_files"
NOT_ABI = "not_abi"
VERDICTS = (OK, NO_CODE, TWO_FILES, NOT_ABI)

# An opening fence with an optional language tag; the closing fence may be missing when the
# completion was cut at max length.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)",
                    re.S | re.M)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)
_ENTRY = re.compile(r"\bcudal2_hgemm\s*\(")
_META = re.compile(r"\bcudal2_meta\b")
_CODE_HINT = re.compile(r"[;{}#]")
# reasoning blocks real models open their answer with
_THINK_OPEN = re.compile(r"<(think|thinking|reasoning)>", re.I)
_THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.I | re.S)
_THINK_CLOSE = re.compile(r"</(think|thinking|reasoning)>", re.I)
# a line that starts C/C++/CUDA code (for trimming prose around an unfenced kernel)
_CODE_START = re.compile(
    r"^\s*(#|//|/\*|\*|extern\b|template\b|__global__|__device__|__host__|static\b|struct\b|"
    r"class\b|namespace\b|using\b|typedef\b|const\b|constexpr\b|inline\b|int\b|void\b|"
    r"unsigned\b|float\b|half\b|size_t\b|auto\b|enum\b|union\b|[A-Za-z_][\w:<>, ]*[*&\s]+\w+\s*\()")
_CODE_END = re.compile(r"([;{}]|\*/|^\s*#.*|^\s*//.*)\s*$")
# how close a quoted header name must be to a template header's to count as a misspelling of it
MISSPELT_CUTOFF = 0.75


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


def strip_reasoning(text: str) -> tuple[str, bool]:
    """(the answer without its reasoning blocks, whether a reasoning block was left open).
    A bare closing tag (templates that open the block in the prompt) ends the reasoning too."""
    text = _THINK_BLOCK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:                                   # "<think>" was in the prompt: keep what follows
        text = text[closes[-1].end():]
    m = _THINK_OPEN.search(text)
    if m:                                        # opened, never closed: cut off while thinking
        return text[:m.start()], True
    return text, False


def code_only(text: str, *, strings: bool = True) -> str:
    """`text` with C/C++ comments (and, with `strings`, string and char literals) blanked out;
    newlines are kept so preprocessor lines stay lines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            end = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, end) or " ")
            i = end
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            end = min(j + 1, n)
            out.append(c + c if strings else text[i:end])
            i = end
            continue
        if c == "R" and nxt == '"' and strings:          # raw string literal R"delim( ... )delim"
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if m:
                close = ")" + m.group(1) + '"'
                j = text.find(close, i + m.end())
                end = n if j < 0 else j + len(close)
                out.append('""' + "\n" * text.count("\n", i, end))
                i = end
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _skip_parens(code: str, i: int) -> int:
    """Index just past the ')' matching the '(' at code[i - 1]; len(code) when unbalanced."""
    depth = 1
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    return i


_AFTER_PARAMS = re.compile(r"\s*(?:(?:const|noexcept|override|final|throw\s*\(\s*\)|"
                           r"__attribute__\s*\(\(.*?\)\)|->\s*[\w:<>]+)\s*)*")


def entry_definitions(code: str) -> int:
    """How many times `code` (comments and strings removed) defines cudal2_hgemm: the name, its
    parameter list, then a body `{` (a declaration or call ends in ';' or ',')."""
    n = 0
    for m in _ENTRY.finditer(code):
        j = _skip_parens(code, m.end())
        k = _AFTER_PARAMS.match(code, j).end()
        if k < len(code) and code[k] == "{":
            n += 1
    return n


def _template_includes(code: str, headers: frozenset[str]) -> list[str]:
    return sorted({Path(h).name for h in _INCLUDE.findall(code) if Path(h).name in headers})


def _misspelt_templates(code: str, headers: frozenset[str]) -> list[tuple[str, str]]:
    """(written, meant) for quoted includes that are not a template header but close to one."""
    out = []
    for h in _QUOTED_INCLUDE.findall(code):
        name = Path(h.strip()).name
        if name in headers:
            continue
        close = difflib.get_close_matches(name, sorted(headers), n=1, cutoff=MISSPELT_CUTOFF)
        if close:
            out.append((h.strip(), close[0]))
    return out


@dataclass(frozen=True)
class _Facts:
    definitions: int
    includes: list[str]
    misspelt: list[tuple[str, str]]
    meta: bool

    @property
    def kernel(self) -> bool:
        return bool(self.definitions or self.includes or self.misspelt)


def _facts(source: str, headers: frozenset[str]) -> _Facts:
    code = code_only(source, strings=False)          # comments out, include paths kept
    bare = code_only(source)                         # strings out too
    return _Facts(entry_definitions(bare), _template_includes(code, headers),
                  _misspelt_templates(code, headers), bool(_META.search(bare)))


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", code_only(text)).strip()


def _trim_prose(text: str) -> str:
    """An unfenced answer: drop prose lines before the first code line and after the last."""
    lines = text.splitlines()
    first = next((i for i, l in enumerate(lines) if _CODE_START.match(l)), None)
    if first is None:
        return text
    last = max((i for i, l in enumerate(lines) if _CODE_END.search(l)), default=len(lines) - 1)
    return "\n".join(lines[first:max(last, first) + 1])


def extract(completion, *, headers: frozenset[str] | None = None) -> Extraction:
    """The kernel file in `completion`, with a verdict (see the module docstring)."""
    headers = template_headers() if headers is None else headers
    text, unfinished = strip_reasoning(completion_text(completion))
    if not text.strip():
        return Extraction(NO_CODE, detail="the completion ended inside its reasoning block"
                          if unfinished else "empty completion")
    blocks = [body for _lang, body in _FENCE.findall(text) if body.strip()]
    if blocks:
        facts = [_facts(b, headers) for b in blocks]
        kernels = [(b, f) for b, f in zip(blocks, facts) if f.kernel]
        distinct = {_normalised(b) for b, _ in kernels}
        if len(distinct) > 1:
            return Extraction(TWO_FILES, kernels[0][0],
                              f"{len(distinct)} different fenced kernel files; answer with exactly one")
        if kernels:
            source, f = kernels[-1]
        else:   # no kernel: report on the largest block
            source = max(blocks, key=len)
            f = _facts(source, headers)
    else:
        source = _trim_prose(text)
        f = _facts(source, headers)
    if not _CODE_HINT.search(source):
        return Extraction(NO_CODE, detail="no C/C++ code in the completion")
    if f.definitions > 1 or len(f.includes) > 1 or (f.definitions and f.includes):
        return Extraction(TWO_FILES, source,
                          "more than one kernel in one file (entry-point definitions or template "
                          "includes)")
    if f.includes:
        return Extraction(OK, source.strip() + "\n", f"template {f.includes[0]}")
    if f.definitions and f.meta:
        return Extraction(OK, source.strip() + "\n", "raw kernel")
    if f.misspelt and not f.definitions:
        written, meant = f.misspelt[0]
        return Extraction(OK, source.strip() + "\n",
                          f'includes "{written}", which is not a template header (did you mean '
                          f'"{meant}"?): the build decides')
    missing = [n for n, ok in (("a definition of cudal2_hgemm", f.definitions),
                               ("cudal2_meta", f.meta)) if not ok]
    return Extraction(NOT_ABI, source.strip() + "\n",
                      f"missing {' and '.join(missing)} and no template include "
                      f"(known: {', '.join(sorted(headers)) or 'none'})")
