"""Pick each piece count's weights from `gpu_session42.sh split`'s sweeps and write them as a bench_kda set file.

For every piece count whose near-equal pieces (``pieces N``) a sweep timed, each weighting of that count (``pieces N
wA:B..``) is compared with them in the same process (CUDA-graph forwards); the weighting with the lowest mean ratio
over the shapes that timed both wins if that mean is below 1. Prints one line per candidate and writes
``PIECE_WEIGHTS={count: weights, ...}`` (counts whose near-equal pieces won left out).

    python scripts/pick_piece_weights.py OUT_DIR/fwd_*/sweep_kda_fwd.json --out set.txt
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

PIECE_KEYS = {"FWD_PIECES", "PIECE_WEIGHTS"}


def ratios(paths: list[str]) -> dict[tuple[int, tuple], list[float]]:
    """(pieces, weights) -> graph ms over the near-equal pieces' of that count in the same sweep, one a shape."""
    out: dict[tuple[int, tuple], list[float]] = defaultdict(list)
    for path in paths:
        res = json.load(open(path))
        equal, weighted = {}, []
        for name, r in res["settings"].items():
            consts, ms = r.get("consts", {}), r.get("fwd_graph_ms")
            if not isinstance(ms, float) or "FWD_PIECES" not in consts or set(consts) - PIECE_KEYS:
                continue
            n = consts["FWD_PIECES"]
            w = consts.get("PIECE_WEIGHTS", {}).get(str(n))
            if w:
                weighted.append((name, n, tuple(w), ms))
            else:
                equal[n] = ms
        for name, n, w, ms in weighted:
            if n in equal:
                out[(n, w)].append(ms / equal[n])
                print(f"{res['shape']:>11} {name:>20} {ms:.3f} ms, {ms / equal[n]:.3f} of {n} equal pieces")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cands = ratios(args.sweeps)
    best: dict[int, tuple] = {}
    for pieces in sorted({n for n, _ in cands}):
        mine = {w: v for (n, w), v in cands.items() if n == pieces}
        most = max(len(v) for v in mine.values())
        w, v = min(((w, v) for w, v in mine.items() if len(v) == most), key=lambda wv: sum(wv[1]) / len(wv[1]))
        mean = sum(v) / len(v)
        print(f"{pieces} pieces: best weights {w}, {mean:.3f} of equal pieces over {len(v)} shape(s)")
        if mean < 1:
            best[pieces] = w
    with open(args.out, "w") as f:
        f.write(f"PIECE_WEIGHTS={best!r}\n")
    print(f"wrote {args.out}: PIECE_WEIGHTS={best!r}")


if __name__ == "__main__":
    main()
