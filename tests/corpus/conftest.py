"""The corpus of SavedModels others wrote (tests/corpus/builders.py), built once per session, lazily per model."""
from __future__ import annotations

import pytest

from tests.corpus import builders


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """corpus(builder) -> its CorpusModel, built on first use into one session directory. Tests must not change
    the models (copy them first)."""
    root = tmp_path_factory.mktemp("corpus")
    built: dict = {}

    def get(builder) -> builders.CorpusModel:
        if builder not in built:
            built[builder] = builder(root)
        return built[builder]

    return get
