#!/usr/bin/env bash
# One GPU call for the kernel-level checks and benchmarks, run from the repo root on the GPU machine:
#   bash scripts/gpu_bench_kernels.sh [FLA_SHAPES] [PARTS]
# FLA_SHAPES: the KDA shapes at which fla-core is timed in the same run (its first call per head count autotunes
# for 1-2.5 min); default 1x8192x32. PARTS: a comma list of kda,tests,conv,attnres,muon,backbone (default: all).
# KDA_TIMEOUT / KDA_DEADLINE (s) bound the KDA benchmark (default 330 / 240).
# fla-core is installed from the carried wheel in .whl/ when present. JSON and logs go to $OUT.
set -u
FLA_SHAPES=${1:-1x8192x32}
PARTS=${2:-kda,tests,conv,attnres,muon,backbone}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla_site .whl/fla_core-*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/fla_site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has kda; then
  timeout "${KDA_TIMEOUT:-330}" python3 kernels/benchmarks/bench_kda.py --deadline "${KDA_DEADLINE:-240}" \
    --prelude-impls ours --profile \
    --shapes 1x8192x32,4x4096x32,1x32768x16,2x16384x16,8x2048x16 --fla-shapes "$FLA_SHAPES" 2>&1 \
    | tail -n 30 | tee "$OUT/kda.log"
fi
if has tests; then  # xdist spreads the Triton compilation over the CPU cores; one GPU
  timeout 170 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/kernels 2>&1 | tail -n 25 \
    | tee "$OUT/gpu_tests.log"
fi
if has conv; then
  timeout 60 python3 kernels/benchmarks/bench_short_conv.py 2>&1 | tail -n 12 | tee "$OUT/conv.log"
fi
if has attnres; then
  timeout 120 python3 -m kimi_vl.benchmarks.bench_attnres 2>&1 | tail -n 30 | tee "$OUT/attnres.log"
fi
if has muon; then
  timeout 90 python3 -m kimi_vl.benchmarks.bench_muon 2>&1 | tail -n 25 | tee "$OUT/muon.log"
fi
if has backbone; then  # small flavor: hybrid vs all-MLA vs hybrid + block AttnRes (train at 4K/32K, decode 32K/128K)
  timeout 240 python3 -m kimi_vl.benchmarks.bench_backbone --train-seqs 4096 32768 --decode-contexts 32768 131072 \
    --iters 3 --decode-steps 32 --peak-tflops 709 2>&1 | tail -n 30 | tee "$OUT/backbone.log"
fi
ls -la "$OUT"
