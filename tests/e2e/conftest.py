"""Fixtures for end-to-end tests against a real llama-server (see docs/real-backend.md).

Every test under tests/e2e except the ``claude_code`` ones is marked ``e2e``.
They run by default, building llama-server and fetching the model into the
cache on first use; set ``DRAGOMAN_SKIP_E2E=1`` to skip them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, LlamaServer

E2E_DIR = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items, not just this directory's.
    skip = os.environ.get("DRAGOMAN_SKIP_E2E") == "1"
    for item in items:
        if not item.path.is_relative_to(E2E_DIR) or item.get_closest_marker("claude_code"):
            continue  # the Claude Code tests need no llama-server and have their own switch
        item.add_marker(pytest.mark.e2e)
        if skip:
            item.add_marker(pytest.mark.skip(reason="DRAGOMAN_SKIP_E2E=1"))


def _serve(factory: pytest.TempPathFactory, name: str, ctx: int, extra_args: list[str]) -> Iterator[LlamaServer]:
    # The log lives in pytest's tmp dir so it survives a failing run for inspection.
    log_dir = factory.mktemp(name)
    server = LlamaServer(ctx=ctx, alias=DEFAULT_LOCAL_MODEL, extra_args=extra_args, log_dir=log_dir)
    with server:  # __exit__ stops the process even when a test or startup fails
        yield server


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    yield from _serve(tmp_path_factory, "llama-server", ctx=4096, extra_args=["--metrics", "--slots"])


@pytest.fixture(scope="session")
def llama_server_small_ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    yield from _serve(tmp_path_factory, "llama-server-small-ctx", ctx=512, extra_args=["--slots"])
