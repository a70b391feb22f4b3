"""What a built kernel is, whatever its source text: the binary key.

binary_key(so) = sha256 of the parts of a built kernel library that decide what it computes and
how fast: per device function its SASS (cuobjdump), its .nv.info attributes (registers, stack,
parameter bank) and the sizes of its static shared memory, local memory and parameter bank; the
device data (constant banks, initialised globals); the host code (objdump of the executable
sections: the launcher, its grid and block arithmetic); the host read-only data (the meta JSON);
the toolchain version and the arch. What a cosmetic edit changes is left out: every symbol name
(function, variable, mangled or not, and the strings equal to one that register them),
addresses, instruction encodings, rip-relative displacements and the order of functions (sorted
by their normalised content). So a renamed or re-commented kernel keeps its key, while a dead
instruction, skipped K work, a half launch or another meta string gets a new one.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

from cudal2.core.toolchain import find_cuobjdump, normalise_arch

KEY_VERSION = 2          # part of the key: a change of the normalisation below bumps it
# 2: the host strings that register device variables by name are dropped as names (an
#    internal-linkage variable's name carries a hash of the whole translation unit)
SYM = "SYM"              # what every symbol name becomes


class BinaryKeyError(RuntimeError):
    """The library cannot be keyed (a tool is missing or cannot read it)."""


def binary_key(so_path, *, arch: str, nvcc: str) -> str:
    """sha256 hex of binary_parts(so_path, arch=arch, nvcc=nvcc)."""
    parts = binary_parts(so_path, arch=arch, nvcc=nvcc)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def binary_parts(so_path, *, arch: str, nvcc: str) -> dict:
    """The normalised pieces the key hashes (for tests and for finding why two keys differ)."""
    so = Path(so_path)
    cuobjdump, objdump = find_cuobjdump(), shutil.which("objdump")
    if cuobjdump is None or objdump is None:
        raise BinaryKeyError(f"binary key needs cuobjdump and objdump "
                             f"(missing: {'cuobjdump' if cuobjdump is None else 'objdump'})")
    # the SASS disassembly takes most of the time: run the three tools at once
    procs = {what: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for what, cmd in (("sass", [cuobjdump, "-sass", str(so)]),
                               ("elf", [cuobjdump, "-elf", str(so)]),
                               ("host", [objdump, "-d", "-w", "--no-show-raw-insn", str(so)]))}
    out = {}
    for what, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        if p.returncode != 0:
            raise BinaryKeyError(f"{Path(p.args[0]).name} could not read {so}: "
                                 f"{stderr.strip().splitlines()[-1:] or p.returncode}")
        out[what] = stdout
    elf = ElfFile(so.read_bytes())
    names = elf.symbol_names() | _device_names(out["sass"], out["elf"])
    functions, data = device_parts(out["sass"], out["elf"])
    return {"version": KEY_VERSION, "arch": normalise_arch(arch), "nvcc": nvcc,
            "device_functions": functions, "device_data": data,
            "host_functions": host_functions(out["host"], elf.defined_names()),
            "rodata": rodata_strings(elf, names)}


# --- device -------------------------------------------------------------------------------
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\* 0x[0-9a-f]+ \*/\s*$")
_SECTION_ROW = re.compile(r"^\s*[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)\s+[0-9a-f]+\s+[0-9a-f]+\s+"
                          r"(\S+)\s+[0-9a-f]+\s+[0-9a-f]+\s+[0-9a-f]+\s+(\.\S+)\s*$")
_SYMTAB_ROW = re.compile(r"^\s*(?:0x)?[0-9a-f]+\s+(?:0x)?[0-9a-f]+\s+(?:0x)?[0-9a-f]+\s+[A-Z_]+\s+"
                         r"[A-Z_]+\s+[A-Z_]+\s+.*?\s(\S+)\s*$")
_HEADER = re.compile(r"^(?:\.section\s+)?(\.[\w.$]+)")
# sections that name or locate things (symbols, notes with paths, debug info, relocations) or
# that restate what the SASS and .nv.info say (.text hex, the call graph)
_SKIP = re.compile(r"^\.(shstrtab|strtab|symtab|note\b|debug|rela?\b|nv\.callgraph|nv\.rel\.|text\.)")


def device_parts(sass: str, elf: str) -> tuple[list[str], list[str]]:
    """(one normalised text per device function, sorted; the device data sections, sorted)."""
    names = _device_names(sass, elf)
    sub = _namer(names)
    per_fn: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = m.group(1)
            per_fn[current] = []
            continue
        m = _SASS_LINE.match(line)
        if current and m:
            per_fn[current].append(sub(m.group(1)))
        elif current and ".headerflags" in line:
            per_fn[current].append(line.strip())
    data = []
    for name, size, typ, body in _elf_sections(elf):
        owner = next((f for f in per_fn if name.endswith("." + f)), None)
        if name == ".nv.info":
            for block in _info_blocks(body):
                fn = next((f for f in per_fn if f"function: {f}(" in block), None)
                (per_fn[fn] if fn else data).append(_info_norm(sub(block)))
        elif owner is not None:
            kind = name[: -len(owner) - 1]
            if kind.startswith(".nv.info"):
                per_fn[owner] += [_info_norm(sub(b)) for b in _info_blocks(body)]
            elif not _SKIP.match(kind):
                per_fn[owner].append(f"{kind} {typ} size={size}")
        elif not _SKIP.match(name) and not name.startswith(".nv.info"):
            data.append(sub(f"{name} {typ} size={size}\n" + "\n".join(body)))
    return sorted("\n".join(v) for v in per_fn.values()), sorted(data)


def _device_names(sass: str, elf: str) -> set[str]:
    names = {m.group(1) for m in map(_FUNCTION.match, sass.splitlines()) if m}
    in_symtab = False
    for line in elf.splitlines():
        if line.startswith(".section"):
            in_symtab = line.split()[1] == ".symtab"
            continue
        m = _SYMTAB_ROW.match(line) if in_symtab else None
        if m and not m.group(1).startswith(".") and m.group(1) != "(null)":
            names.add(m.group(1))
    return names


def _elf_sections(elf: str):
    """(name, size, type, body lines) of every section of every cubin in `cuobjdump -elf`."""
    table: dict[str, tuple[str, str]] = {}
    name, body = None, []
    for line in elf.splitlines() + ["Fatbin"]:
        row = _SECTION_ROW.match(line)
        if row:
            table[row.group(3)] = (row.group(1), row.group(2))
            continue
        head = _HEADER.match(line)
        if head or line.startswith("Fatbin"):
            if name is not None:
                size, typ = table.get(name, ("?", "?"))
                yield name, size, typ, body
            name, body = (head.group(1) if head else None), []
            if line.startswith("Fatbin"):
                table = {}
        elif name is not None and line.strip():
            body.append(line.strip())


def _info_blocks(body: list[str]) -> list[str]:
    """The attribute entries (<0x1> Attribute ... Value ...) of a .nv.info section."""
    blocks: list[list[str]] = []
    for line in body:
        if re.fullmatch(r"<0x[0-9a-f]+>", line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    return ["\n".join(b) for b in blocks]


def _info_norm(block: str) -> str:
    """Symbol and section indices dropped: they follow the names' order."""
    block = re.sub(rf"{SYM}\(0x[0-9a-f]+\)", SYM, block)
    return re.sub(r"(EIATTR_PARAM_CBANK\n.*\nValue:\s*)0x[0-9a-f]+", r"\1#", block)


def _namer(names: set[str]):
    """A function replacing each whole occurrence of one of `names` by SYM."""
    if not names:
        return lambda s: s
    alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pat = re.compile(rf"(?<![\w$.])(?:{alt})(?![\w$])")
    return lambda s: pat.sub(SYM, s)


# --- host ---------------------------------------------------------------------------------
_HOST_FN = re.compile(r"^[0-9a-f]+ <(.+)>:$")
_HOST_INSN = re.compile(r"^\s*[0-9a-f]+:\s+(.*)$")
_TARGET = re.compile(r"\b[0-9a-f]+ <([^>]+)>")
_RIP = re.compile(r"[-+]?0x[0-9a-f]+\(%rip\)")


def host_functions(objdump: str, defined: set[str]) -> list[str]:
    """One normalised text per host function (objdump -d), sorted: addresses, rip-relative
    displacements and symbol names dropped; a jump inside a function keeps its offset, a call
    to an import keeps the import's name (cudaLaunchKernel@plt), any other target becomes FN."""
    fns: list[list[str]] = []
    name = None
    for line in objdump.splitlines():
        head = _HOST_FN.match(line)
        if head:
            name = head.group(1)
            fns.append([])
            continue
        insn = _HOST_INSN.match(line)
        if not insn or not fns:
            continue
        text = insn.group(1).split("#", 1)[0].strip()
        text = _RIP.sub("(%rip)", text)
        text = _TARGET.sub(lambda m: _target(m.group(1), name, defined), text)
        fns[-1].append(re.sub(r"\s+", " ", text))
    return sorted("\n".join(f) for f in fns)


def _target(sym: str, here: str, defined: set[str]) -> str:
    base, _, off = sym.partition("+")
    if base == here:
        return f"<+{off or '0x0'}>"
    plain = base.split("@")[0]
    if base.endswith("@plt") and plain not in defined:
        return f"<{base}>"
    return "<FN>"


def rodata_strings(elf: "ElfFile", names: set[str]) -> list[str]:
    """The host's read-only data as its NUL-separated pieces, in order, less the pieces equal
    to a symbol name (the kernel and device-variable names the launcher registers, host or
    device symbols) and the empty ones (padding)."""
    raw = b"".join(elf.section(n) for n in elf.sections if n.startswith(".rodata"))
    keep = (p for p in raw.split(b"\0") if p and p.decode("latin-1") not in names)
    return [p.decode("latin-1") for p in keep]


# --- a minimal ELF64 reader (sections and symbol names; no pyelftools needed) -------------
class ElfFile:
    def __init__(self, data: bytes):
        if data[:4] != b"\x7fELF" or data[4] != 2:
            raise BinaryKeyError("not a 64-bit ELF file")
        self.data = data
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        self._list = heads
        self._heads = {self._str(heads[shstrndx], h[0]): h for h in heads}
        self.sections = list(self._heads)

    def _str(self, strtab_head, offset: int) -> str:
        start = strtab_head[4] + offset
        return self.data[start:self.data.index(b"\0", start)].decode("latin-1")

    def section(self, name: str) -> bytes:
        h = self._heads[name]
        return b"" if h[1] == 8 else self.data[h[4]:h[4] + h[5]]      # 8: SHT_NOBITS

    def _symbols(self):
        for tab in (".symtab", ".dynsym"):
            h = self._heads.get(tab)
            if h is None:
                continue
            strs = self._list[h[6]]
            for off in range(h[4], h[4] + h[5], 24):
                name_off, _, _, shndx = struct.unpack_from("<IBBH", self.data, off)
                if name_off:
                    yield self._str(strs, name_off), shndx

    def symbol_names(self) -> set[str]:
        return {n for n, _ in self._symbols()}

    def defined_names(self) -> set[str]:
        return {n for n, shndx in self._symbols() if shndx != 0}
