"""Fixtures of this folder's code-environment tests (`tests.support.code_env`)."""

from tests.support.code_env import env, task  # noqa: F401 - registered as this folder's fixtures
