"""A test plugin (loaded through ``modules``): provider ``hold``'s model streams "working" and
waits until its request is aborted when the prompt is "hold"; when it is "gate", it streams
"first" and waits until ``GATE`` is set; when it is "split", it streams its answer and its
reasoning in several deltas each; it echoes anything else."""

import asyncio

from dsh_core import (
    Finish,
    PluginSpec,
    ReasoningDelta,
    ScriptedAdapter,
    ScriptedReply,
    TextDelta,
    hookimpl,
)

SPLIT = (
    ReasoningDelta(index=0, text="let me "),
    ReasoningDelta(index=0, text="think"),
    TextDelta(index=1, text="one, "),
    TextDelta(index=1, text=""),
    TextDelta(index=1, text="two, "),
    TextDelta(index=1, text="three"),
    Finish(reason="stop"),
)


#: What a "gate" prompt's model waits for (a test sets a fresh event first).
GATE = asyncio.Event()


def _model(request):
    if request.last_user_text == "hold":
        return ScriptedReply(text="working", wait=asyncio.Event().wait)
    if request.last_user_text == "gate":
        return ScriptedReply(text="first", wait=GATE.wait)
    if request.last_user_text == "split":
        return ScriptedReply(chunks=SPLIT)
    return request.last_user_text


def _apply(ctx, _):
    ctx.llm.register_adapter("hold", ScriptedAdapter(_model))


@hookimpl
def dsh_plugins():
    return [PluginSpec(name="hold-model", apply=_apply, requires=("llm",), description="hold")]
