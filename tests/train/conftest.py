import pytest

from data_pipelines.synth.build import build_dataset, split_shards
from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The `tiny` synthetic preset (seed 0) with a 2048-token tokenizer, built once per session."""
    root = tmp_path_factory.mktemp("tiny_data") / "data"
    build_dataset(root, "tiny", seed=0)
    train_tokenizer(iter_corpus_texts(split_shards(root, "train")), root / "tokenizer", vocab_size=2048)
    return root
