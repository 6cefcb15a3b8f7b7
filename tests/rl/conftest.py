from dataclasses import replace

import pytest

from data_pipelines.synth.build import PRESETS, build_dataset, split_shards
from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

TRAIN = {"shapes": 10, "ocr": 4, "chart": 4, "document": 2, "chat": 4, "text_mirror": 10, "prose": 4}
EVAL = {"shapes": 6, "ocr": 2, "chart": 2, "text_mirror": 6}


@pytest.fixture(scope="session")
def rl_data(tmp_path_factory):
    """A small slice of the `tiny` synthetic world (seed 0; no video) with a 1024-token tokenizer, built once."""
    preset = replace(PRESETS["tiny"], name="rl_test", train=TRAIN, eval=EVAL)
    root = tmp_path_factory.mktemp("rl_data") / "data"
    build_dataset(root, preset, seed=0)
    train_tokenizer(iter_corpus_texts(split_shards(root, "train")), root / "tokenizer", vocab_size=1024)
    return root
