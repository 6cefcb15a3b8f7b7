"""The 2-GPU distributed benchmark runs end to end on 2 gloo CPU processes: updates match, bytes are counted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dist_muon_benchmark_on_gloo(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(tmp_path), PYTHONPATH=str(ROOT))
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "kimi_vl.benchmarks.dist_muon", "--device", "cpu",
           "--vocab", "512", "--width", "64", "--layers", "2", "--mlp", "176", "--heads", "4", "--batch", "4",
           "--seq", "32", "--steps", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((tmp_path / "dist_muon.json").read_text())
    print(proc.stdout[-1500:])
    for case in ("ddp", "fsdp2"):
        bf16, fp32 = result[case]["bfloat16"], result[case]["float32"]
        assert bf16["same_grad_max_rel"] <= 1e-5, (case, bf16)
        assert fp32["end_to_end_max_rel"] <= 1e-4, (case, fp32)
        muon, adamw = bf16["muonclip_bytes"], bf16["adamw_bytes"]
        # every collective was seen: the gradient all-reduce (DDP hook) or FSDP2's gathers and reduce-scatters
        assert adamw["bus_bytes"] > 0 and muon["bus_bytes"] > adamw["bus_bytes"]
        assert bf16["bus_bytes_ratio"] <= 1.25, (case, bf16["bus_bytes_ratio"], muon["by_op"], adamw["by_op"])
