"""Shared fixtures for the data-pipeline tests: one tiny dataset and tokenizer per session."""

from __future__ import annotations

import pytest
from data_testing import MINI

from data_pipelines.synth.build import build_dataset, split_shards
from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer


@pytest.fixture(scope="session")
def mini_dataset(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mini") / "ds"
    manifest = build_dataset(root, MINI, seed=3)
    return root, manifest


@pytest.fixture(scope="session")
def tokenizer(mini_dataset, tmp_path_factory: pytest.TempPathFactory):
    root, _ = mini_dataset
    return train_tokenizer(iter_corpus_texts(split_shards(root, "train")), tmp_path_factory.mktemp("tok"), 1024)
