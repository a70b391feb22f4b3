"""shapes/*.csv are what scripts/make_shapes.py writes (its docstring promises byte for byte)."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_shape_lists_are_reproducible(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_shapes.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("llm_trace.csv", "stratified_100.csv"):
        assert (tmp_path / name).read_bytes() == (REPO / "shapes" / name).read_bytes(), name
