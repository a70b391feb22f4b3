"""Built kernels a table carries, so that a serving machine without nvcc serves it.

Under a table's root (generated_kernels/ or the user's table), per (arch, source)::

    bin/<arch>/<sha256>.so     the library nvcc built from the row's source (sha256: index column)
    bin/<arch>/<sha256>.json   its provenance: {format, arch, source_sha256, so_sha256, nvcc,
                               cuda, gpus}

Dispatch uses a carried library instead of building only when (as TunableOp validates its
results file against the running versions) its record is readable, names this arch and this
source, the .so hashes to the recorded so_sha256, and the CUDA major it was built with equals
the running torch's: a library built with `-cudart shared` needs libcudart of its own major,
and CUDA keeps binary compatibility within a major only. Otherwise it says why, and builds.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cudal2.core.identity import file_sha
from cudal2.core.store import atomic_write_bytes

BIN_DIR = "bin"
FORMAT = 1


def paths(root, arch: str, sha: str) -> tuple[Path, Path]:
    """(<root>/bin/<arch>/<sha>.so, the .json beside it)."""
    d = Path(root) / BIN_DIR / arch
    return d / f"{sha}.so", d / f"{sha}.json"


def cuda_of(nvcc_version: str) -> str:
    """The CUDA release of an nvcc version: '13.0.88' -> '13.0'."""
    return ".".join(str(nvcc_version).split(".")[:2])


def carry(root, arch: str, sha: str, so_path, *, nvcc: str, gpus=()) -> Path:
    """Copy a built library into the table at `root` with its provenance (both atomically, the
    .so first, so a record never names a missing or half-written library). Returns the .so."""
    so, rec = paths(root, arch, sha)
    data = Path(so_path).read_bytes()
    atomic_write_bytes(so, data)
    record = {"format": FORMAT, "arch": arch, "source_sha256": sha,
              "so_sha256": hashlib.sha256(data).hexdigest(), "nvcc": nvcc, "cuda": cuda_of(nvcc),
              "gpus": sorted(set(gpus))}
    atomic_write_bytes(rec, (json.dumps(record, indent=1) + "\n").encode())
    return so


def check(root, arch: str, sha: str, *, cuda: str | None) -> tuple[Path | None, str]:
    """(the .so, '') when the carried library may be loaded here; (None, '') when the table
    carries none; (None, why) when it is refused. `cuda`: the running torch's CUDA version
    (torch.version.cuda; None on a CPU build)."""
    so, rec_path = paths(root, arch, sha)
    if not rec_path.exists():
        return None, (f"{so} has no provenance record {rec_path.name}" if so.exists() else "")
    try:
        rec = json.loads(rec_path.read_text())
        want = (rec["format"], rec["arch"], rec["source_sha256"], rec["so_sha256"], rec["cuda"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{rec_path}: unreadable provenance ({exc!r})"
    fmt, rec_arch, rec_sha, so_sha, rec_cuda = want
    if fmt != FORMAT:
        return None, f"{rec_path}: format {fmt!r}, this cudal2 reads {FORMAT}"
    if rec_arch != arch:
        return None, f"{rec_path}: built for arch {rec_arch!r}, this GPU is {arch}"
    if rec_sha != sha:
        return None, f"{rec_path}: built from source {str(rec_sha)[:12]}, the row's is {sha[:12]}"
    if not so.is_file():
        return None, f"{so} is missing (its record {rec_path.name} is there)"
    got = file_sha(so)
    if got != so_sha:
        return None, f"{so}: sha256 {got[:12]} but {rec_path.name} records {str(so_sha)[:12]}"
    if not cuda:
        return None, "this torch has no CUDA (torch.version.cuda is None)"
    if str(rec_cuda).split(".")[0] != str(cuda).split(".")[0]:
        return None, f"{rec_path}: built with CUDA {rec_cuda}, this torch runs CUDA {cuda}"
    return so, ""


def prune(root, keep: set[tuple[str, str]]) -> list[Path]:
    """Delete carried libraries (and records) whose (arch, sha) is not in `keep`: a kernel that
    left the table takes its binary with it. Returns what was deleted."""
    gone = []
    for p in sorted((Path(root) / BIN_DIR).glob("*/*")):
        if p.suffix in (".so", ".json") and (p.parent.name, p.stem) not in keep:
            p.unlink()
            gone.append(p)
    return gone
