"""The reward harness: worker sandbox, audit, correctness and timing (measure), results DB,
evaluate(). Submodules load on first use so `import cudal2` stays light (no GPU query, no
pandas)."""
from cudal2.harness.types import ACCS, BASELINES, LAYOUTS, MODES, STATUSES, EvalRequest, Evaluation, Shape

_LAZY = {
    "evaluate": "pipeline", "evaluate_many": "pipeline", "gpu_pool": "pipeline",
    "ResultsDB": "db",
    "WorkerPool": "worker", "WorkerOutcome": "worker",
    "audit_file": "audit", "audit_source": "audit", "AuditResult": "audit",
}

__all__ = ["ACCS", "BASELINES", "LAYOUTS", "MODES", "STATUSES", "EvalRequest", "Evaluation",
           "Shape", *_LAZY]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'cudal2.harness' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
