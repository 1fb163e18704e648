"""Both transports under one set of tests: the SDK path is the builtin transport's oracle."""

from __future__ import annotations

import importlib.util

import attrs
import pytest

from dsh_llm_openai import OpenAIAdapter, OpenAIConfig


@pytest.fixture(params=["builtin", "openai-sdk"])
def both_transports(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every adapter the test makes uses this transport (a module opts in with
    ``pytestmark = pytest.mark.usefixtures("both_transports")``)."""
    transport: str = request.param
    if transport == "openai-sdk" and importlib.util.find_spec("openai") is None:
        pytest.skip("the openai SDK is not installed (the [sdk] extra)")
    original = OpenAIAdapter.__init__

    def init(self: OpenAIAdapter, config: OpenAIConfig | None = None) -> None:
        original(self, attrs.evolve(config or OpenAIConfig(), transport=transport))

    monkeypatch.setattr(OpenAIAdapter, "__init__", init)
    return transport
