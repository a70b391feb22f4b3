"""GPU timing primitives: kernel time (kerneltime) and the statistics behind every speedup
(stats). Used by the runtime's first-call race and by the harness alike."""
