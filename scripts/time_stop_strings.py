"""Host time of lm-eval's stop-string check (``eval.lm_eval_model.StopStrings``) against decoding every row's whole new
text at every step, over one batch's generation (8 rows, 512-token prompts, random ids, a stop string that never
appears; a 1024-token byte-level BPE trained on synthetic text). CPU only:

    python scripts/time_stop_strings.py [--steps 1024]
"""

import argparse
import tempfile
import time

import torch

from data_pipelines.tokenizer import train_tokenizer
from eval.bench_decode import synthetic_sentences
from eval.lm_eval_model import StopStrings

STOP = ["<never-appears>"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1024)
    steps = p.parse_args().steps
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer(synthetic_sentences(400), tmp + "/tok", vocab_size=1024)
    ids = torch.randint(300, len(tok), (8, 512 + steps), generator=torch.Generator().manual_seed(0))
    crit = StopStrings(tok, STOP, 512)
    checks = {"whole texts": lambda n: [any(s in t for s in STOP)
                                        for t in tok.batch_decode(ids[:, 512:n], skip_special_tokens=False)],
              "tail (StopStrings)": lambda n: crit(ids[:, :n])}
    for name, check in checks.items():
        t0 = time.perf_counter()
        for n in range(513, 513 + steps):
            check(n)
        print(f"{name}: {1e3 * (time.perf_counter() - t0):.1f} ms for {steps} steps at batch 8")


if __name__ == "__main__":
    main()
