"""Host cost per call of torch.matmul vs cudal2.matmul, its custom op and CUDAL2_DISABLE.

Same as `python -m cudal2.runs.overhead` / `cudal2 bench --overhead` (see cudal2/runs/overhead.py).
"""
import sys

from cudal2.runs.overhead import main

if __name__ == "__main__":
    sys.exit(main())
