"""A test plugin (loaded through ``modules``): provider ``hold``'s model streams "working" and
waits until its request is aborted when the prompt is "hold"; it echoes anything else."""

import asyncio

from dsh_core import PluginSpec, ScriptedAdapter, ScriptedReply, hookimpl


def _model(request):
    if request.last_user_text == "hold":
        return ScriptedReply(text="working", wait=asyncio.Event().wait)
    return request.last_user_text


def _apply(ctx, _):
    ctx.llm.register_adapter("hold", ScriptedAdapter(_model))


@hookimpl
def dsh_plugins():
    return [PluginSpec(name="hold-model", apply=_apply, requires=("llm",), description="hold")]
