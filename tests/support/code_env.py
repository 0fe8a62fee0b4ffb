"""The code environment's test fixtures (module-scoped: one task of the code suite and one
environment, whose container is pooled across a module's tests) and helpers. Test folders that
use them register the fixtures in their conftest.py."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from cua_jax.environments.code_env import CodeEnvConfig, CodeEnvironment
from cua_jax.tasks.code_tasks import load_code_task

SUITE = pathlib.Path(__file__).resolve().parents[2] / "cua_jax" / "tasks" / "suites" / "code"


@pytest.fixture(scope="module")
def task():
    return load_code_task(SUITE / "code-inflection-000.json")


@pytest.fixture(scope="module")
def env():
    environment = CodeEnvironment(CodeEnvConfig(default_timeout=20, output_limit=2000))
    yield environment
    asyncio.run(environment.close())


def run(coro):
    return asyncio.run(coro)


def text_of(step) -> str:
    assert not step.done, step.outcome
    return step.observation.text
