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
case "${1:?usage: gpu_session20.sh prep|prep3}" in
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
esac
ls -la "$OUT"
