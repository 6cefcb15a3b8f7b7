#!/usr/bin/env bash
# Prepared in session 19 for the next session's GPU call (results: docs/results/gpu-<date>-s20/):
#   bash scripts/gpu_session20.sh prep   where the KDA prep kernel's time goes. It is the forward's largest gap to fla
#       (0.326 ms against fla's 0.155 for the same work at 1 x 8192 x 32 on an H200, session 19 call3), the H200 kind
#       reads no hardware counters, and its first pass (the row norms) costs only 0.008 ms (call4). So the sweep times
#       the kernel with parts of its main pass left out (PREP_PROBE: no gate, no cumsums, no qg / kg, no G store, and
#       combinations; wrong results by design, never picked as best), and two layouts (K split over programs; G_last - G
#       from one scan), after the KDA tests on the GPU.
# Part limits sum to 380 s (one command may run 600).
set -u
source "$(dirname "$0")/gpu_parts.sh"

gpu_header
case "${1:?usage: gpu_session20.sh prep|prep3|fuse}" in
prep)
  install_fla
  kda_tests 100
  sweep_best 1x8192x32 280 "probe prep no gate,probe prep no cumsum,probe prep no qg kg,probe prep no G store,\
probe prep gate cumsum gl only,probe prep g load gl only,prep bk16,prep split,prep one scan,prep split one scan,\
prep split bk64,prep split w2"
  ;;
prep3)  # after call1 (one scan: prep 0.327 -> 0.279 ms; the prep kernel holds 162 registers, 80 at one scan and 16
  # columns, 72 without qg / kg): one-scan narrow tiles, and qg / kg from the scores kernel's W / U loop
  install_fla
  kda_tests 100 -k "prep_layouts or probes"
  sweep_best 1x8192x32 200 "prep one scan,prep one scan bk16,prep one scan bk16 w2,qgkg wu,qgkg wu bk16,\
qgkg wu bk16 w2,qgkg wu wu16,qgkg wu wu64"
  ;;
fuse)  # after call2 (qg / kg from the W / U loop: prep 0.181 ms, scores +0.058, forward -7%): no prep kernel at
  # all (PREP_IN_SCORES: norms, gate and G inside the scores kernel; fewer spills there, 180 bytes against 376).
  # The KDA tests run on a copy of this tree with that setting as the default; then the sweep, then the five shapes
  # against fla with the sweep's best setting.
  install_fla
  rm -rf /tmp/flip && cp -r . /tmp/flip
  sed -i 's/^PREP_IN_SCORES = False/PREP_IN_SCORES = True/' /tmp/flip/kernels/kda/chunk_triton.py
  grep -n "^PREP_IN_SCORES" /tmp/flip/kernels/kda/chunk_triton.py | tee -a "$LOG"
  (cd /tmp/flip && export PYTHONPATH=/tmp/flip:$PYTHONPATH \
    && python3 -c "import kernels.kda.chunk_triton as c; print('tests with PREP_IN_SCORES =', c.PREP_IN_SCORES)" \
    | tee -a "$LOG" && kda_tests 110 tests/model/test_kda_layer_backends.py)
  sweep_best 1x8192x32 170 "qgkg wu,prep in scores,prep in scores nreg192,prep in scores nreg255,prep in scores s2,\
prep in scores bk32"
  bench_five 200 "$OUT/1x8192x32/best.txt"
  ;;
esac
ls -la "$OUT"
