"""2-process gloo DDP (accelerate, MuonClip owner scheme) equals 1 process running the doubled batch."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from data_pipelines.loader import LoaderConfig, build_loader
from data_pipelines.synth.build import split_shards
from data_pipelines.tokenizer import load_tokenizer

WORKER = Path(__file__).with_name("ddp_worker.py")


def run_worker(nproc: int, data: Path, batches: Path, out: Path, *extra: str) -> dict:
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           str(WORKER), str(data), str(batches), str(out), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out / "result.pt")


def text_batches(data: Path, path: Path) -> None:
    """Two packed text-only batches of 4 rows x 64 tokens from ``data``'s train split, saved to ``path``."""
    tok = load_tokenizer(data / "tokenizer")
    loader = build_loader(LoaderConfig(text_shards=split_shards(data, "train", "text"), seq_len=64,
                                       batch_size=4, resampled=False, epochs=1, max_batches=2), tok)
    batches = [{k: v for k, v in b.items() if k != "loader_state"} for b in loader]
    assert len(batches) == 2
    torch.save(batches, path)


def test_two_process_ddp_equals_one_process_doubled_batch(tiny_data, tmp_path):
    text_batches(tiny_data, tmp_path / "batches.pt")
    one = run_worker(1, tiny_data, tmp_path / "batches.pt", tmp_path / "one")
    two = run_worker(2, tiny_data, tmp_path / "batches.pt", tmp_path / "two")
    for name, w in one["state"].items():
        if w.is_floating_point():
            err = (two["state"][name] - w).abs().max().item()
            assert err <= 1e-5 * max(1.0, w.abs().max().item()), f"{name}: max |diff| {err:.2e}"


def test_two_process_ddp_with_an_unused_vision_tower(tiny_data, tmp_path):
    """Text-only batches through a model with a vision tower (as in zero-vision SFT): its parameters get no gradient,
    and DDP (find_unused_parameters, the run config's default) trains on and matches one process. Tolerance 1e-4:
    the unused-parameter search changes DDP's bucket order, so fp32 gradient sums round differently (2.3e-5 seen)."""
    text_batches(tiny_data, tmp_path / "batches.pt")
    one = run_worker(1, tiny_data, tmp_path / "batches.pt", tmp_path / "one", "debug")
    two = run_worker(2, tiny_data, tmp_path / "batches.pt", tmp_path / "two", "debug")
    assert any(name.startswith("vision") or ".vision" in name for name in two["state"]), "no vision tower built"
    for name, w in one["state"].items():
        if w.is_floating_point():
            err = (two["state"][name] - w).abs().max().item()
            assert err <= 1e-4 * max(1.0, w.abs().max().item()), f"{name}: max |diff| {err:.2e}"
