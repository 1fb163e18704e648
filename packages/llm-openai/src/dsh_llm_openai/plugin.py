"""The ``llm-openai`` entry point of dsh-llm-openai.

Mountable plugin ``llm-openai`` (requires ``llm``): routes its ``provider`` (default
``openai``) to an :class:`OpenAIAdapter` built from the row's config, and closes the adapter's
HTTP client when the row is disposed. The keys are documented in docs/configuration.md.
"""

from __future__ import annotations

from dsh_core import Context, PluginSpec, hookimpl

from ._adapter import OpenAIAdapter, OpenAIConfig

__all__ = ["dsh_plugins"]


def _apply(ctx: Context, config: OpenAIConfig) -> None:
    adapter = OpenAIAdapter(config)
    ctx.llm.register_adapter(config.provider, adapter)
    ctx.fiber.add(adapter.aclose)


LLM_OPENAI = PluginSpec(
    name="llm-openai",
    apply=_apply,
    requires=("llm",),
    config_type=OpenAIConfig,
    description="OpenAI-compatible chat-completions models",
)


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The plugins dsh-llm-openai can mount: ``llm-openai``."""
    return [LLM_OPENAI]
