"""The budget: per arm and held-out shape (and seed), a number of evaluations and optionally
GPU-seconds, the same for every arm.

An evaluation is one distinct binary an arm asks for at a shape: a table hit (its value is read;
the table's draws of it cost their GPU-seconds) or a miss (no value; queued for the GPU, costs no
GPU-seconds yet). Asking again for a binary already asked for is a repeat: free. Sources that do
not build cost nothing (no binary). The RL arm is charged its training: ceil(T / n) evaluations
and G / n GPU-seconds per shape, T and G its run's training reads and their GPU-seconds
(rlrun.py), n the held-out shapes; so the arm that learned from the GPU pays for it where it is
compared, spread over the shapes it is compared on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Allowance:
    evaluations: int
    gpu_seconds: float | None      # None: no GPU-seconds cap


@dataclass(frozen=True)
class Budget:
    evaluations: int                     # per arm and shape
    gpu_seconds: float | None = None     # per arm and shape; None = evaluations only
    rl_reads: int = 0                    # T
    rl_gpu_seconds: float = 0.0          # G
    n_shapes: int = 1                    # n: the whole held-out set (every shard)

    def __post_init__(self):
        if self.evaluations < 1:
            raise ValueError(f"--budget must be >= 1 evaluation per shape, got {self.evaluations}")
        if self.n_shapes < 1:
            raise ValueError("no held-out shapes")

    @property
    def rl_charge(self) -> int:
        return math.ceil(self.rl_reads / self.n_shapes)

    @property
    def rl_charge_gpu_seconds(self) -> float:
        return self.rl_gpu_seconds / self.n_shapes

    def allowance(self, arm: str) -> Allowance:
        if arm != "rl":
            return Allowance(self.evaluations, self.gpu_seconds)
        gs = None if self.gpu_seconds is None else max(0.0, self.gpu_seconds - self.rl_charge_gpu_seconds)
        return Allowance(max(0, self.evaluations - self.rl_charge), gs)

    def charged(self, arm: str) -> tuple[int, float]:
        """(evaluations, GPU-seconds) charged to the arm per shape before it searches."""
        return (self.rl_charge, self.rl_charge_gpu_seconds) if arm == "rl" else (0, 0.0)

    def to_json(self) -> dict:
        return {"evaluations": self.evaluations, "gpu_seconds": self.gpu_seconds,
                "rl_reads": self.rl_reads, "rl_gpu_seconds": self.rl_gpu_seconds,
                "n_shapes": self.n_shapes, "rl_charge": self.rl_charge,
                "rl_charge_gpu_seconds": self.rl_charge_gpu_seconds}
