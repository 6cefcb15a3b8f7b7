"""GPU benchmarks of the kimi_vl model (run on a CUDA machine; each writes JSON to $OUT)."""
