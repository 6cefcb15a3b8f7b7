"""The GPU's power draw and SM clock while a command runs: ``nvidia-smi`` sampled every ``--every-ms`` in the
background, summarised over the busy samples (utilisation >= ``--busy``): median / min power and SM clock, the
clock's maximum and the power limit, and how often each clock-event reason (power cap, thermal, ...) was active.

    python scripts/gpu_clocks.py --out $OUT/clocks_run1 -- python3 -m kimi_vl.benchmarks.bench_backbone ...

Writes ``samples.csv`` and ``clocks.json`` under ``--out`` and prints one line; the command's exit status is
returned.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

FIELDS = ["timestamp", "utilization.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.max.sm", "clocks.mem",
          "temperature.gpu", "clocks_event_reasons.active"]
# the names nvidia-smi's CSV header gives some queried fields (driver 580: "clocks.current.sm [MHz]")
ALIASES = {"clocks.current.sm": "clocks.sm", "clocks.current.memory": "clocks.mem"}
# bits of clocks_event_reasons.active (nvidia-smi --help-query-gpu)
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown"}


def number(text: str) -> float | None:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def summarize(rows: list[dict[str, str]], busy: float) -> dict:
    """Busy samples' power and clocks (medians, extremes) and the share of them with each clock-event reason."""
    rows = [{ALIASES.get(k, k): v for k, v in r.items()} for r in rows]
    hot = [r for r in rows if (number(r.get("utilization.gpu", "")) or 0) >= busy]
    out: dict = {"samples": len(rows), "busy_samples": len(hot)}
    for field in ("power.draw", "clocks.sm", "clocks.mem", "temperature.gpu"):
        vals = [v for v in (number(r.get(field, "")) for r in hot) if v is not None]
        if vals:
            out[field] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    for field in ("power.limit", "clocks.max.sm"):
        vals = [v for v in (number(r.get(field, "")) for r in rows) if v is not None]
        if vals:
            out[field] = max(vals)
    masks = [int(r["clocks_event_reasons.active"], 16) for r in hot
             if r.get("clocks_event_reasons.active", "").strip().startswith("0x")]
    if masks:
        out["reason_share"] = {name: sum(1 for m in masks if m & bit) / len(masks) for bit, name in REASONS.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--every-ms", type=int, default=50)
    ap.add_argument("--busy", type=float, default=90.0, help="utilisation (%%) from which a sample counts as busy")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples = out / "samples.csv"
    with samples.open("w") as f:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,nounits",
                                f"-lms={args.every_ms}"], stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = subprocess.call(cmd)
        finally:
            smi.terminate()
            smi.wait()
    with samples.open() as f:
        reader = csv.DictReader(f, skipinitialspace=True)  # headers carry units: "power.draw [W]"
        rows = [{k.split(" [")[0].strip(): v for k, v in r.items() if k} for r in reader]
    summary = summarize(rows, args.busy)
    (out / "clocks.json").write_text(json.dumps(summary, indent=2))
    pw, sm = summary.get("power.draw", {}), summary.get("clocks.sm", {})
    print(f"clocks {out.name}: {summary['busy_samples']} busy samples of {summary['samples']}; power median "
          f"{pw.get('median', float('nan')):.0f} W (limit {summary.get('power.limit', float('nan')):.0f}); SM clock "
          f"median {sm.get('median', float('nan')):.0f} MHz, min {sm.get('min', float('nan')):.0f} (max "
          f"{summary.get('clocks.max.sm', float('nan')):.0f}); reasons {summary.get('reason_share', {})}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
