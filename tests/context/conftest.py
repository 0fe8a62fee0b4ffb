"""Shared, session-wide tokenizer/processor fixtures for the context tests (loading costs seconds)."""

import pytest

from cua_jax.context.render import ChatRenderer
from cua_jax.context.tokenizer import load_processor


@pytest.fixture(scope="session")
def tokenizer_and_processor():
    return load_processor()


@pytest.fixture(scope="session")
def renderer(tokenizer_and_processor):
    tokenizer, image_processor = tokenizer_and_processor
    return ChatRenderer(tokenizer, image_processor)
