"""What names a kernel source.

source_sha(text): the kernel's identity, what the results DB, the cache rule and RL key on: the
sha256 of its canonical form (comments out, whitespace runs collapsed), so an edit that changes
no code is the same kernel and is neither rebuilt nor timed again.
device_sha(text): the identity of its device code (the meta's strings out too): what a budget
of distinct kernels counts.
content_sha(text): the sha256 of the exact text (a file's integrity: generated_kernels/index.csv,
a campaign pack's manifest).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

# C/C++ string and character literals, line and block comments, in one alternation so a comment
# marker inside a string stays code.
_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def canonical(text: str) -> str:
    """The source with comments removed, runs of spaces and tabs collapsed outside string and
    character literals, and blank lines and line-end spaces dropped (line breaks kept: the
    preprocessor reads them)."""
    out, pos = [], 0
    for m in _TOKENS.finditer(text):
        out.append(_squeeze(text[pos:m.start()]))
        tok = m.group(0)
        out.append(tok if tok[0] in "\"'" else " ")
        pos = m.end()
    out.append(_squeeze(text[pos:]))
    lines = (line.strip() for line in "".join(out).split("\n"))
    return "\n".join(line for line in lines if line)


def code_only(text: str) -> str:
    """The source with comments and string and character literals blanked: the identifiers
    the code itself spells (what a rule about names reads)."""
    return _TOKENS.sub(" ", text)


def _squeeze(code: str) -> str:
    return re.sub(r"[ \t\r\f\v]+", " ", code)


def source_sha(text: str) -> str:
    return hashlib.sha256(canonical(text).encode("utf-8")).hexdigest()


def content_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# the ABI's meta function and its body (one level of braces: the meta is a returned string)
_META_FN = re.compile(r'(cudal2_meta\s*\([^)]*\)\s*\{)((?:[^{}]|\{[^{}]*\})*)(\})')
_STRINGS = re.compile(r'"(?:\\.|[^"\\\n])*"(?:\s*"(?:\\.|[^"\\\n])*")*')   # adjacent literals: one


def device_sha(text: str) -> str:
    """The identity of a kernel's device code: the sha256 of the canonical source with every
    string literal (or run of adjacent ones) of its `cudal2_meta` function emptied, so kernels
    that differ only in their meta, comments or whitespace are one device code."""
    code = canonical(text)
    code = _META_FN.sub(lambda m: m.group(1) + _STRINGS.sub('""', m.group(2)) + m.group(3), code)
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def file_sha(path) -> str:
    """sha256 of a file's bytes (a built library, a pack's or a table's file): what it is, byte
    for byte, as opposed to source_sha's identity of a kernel's text."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
