"""A test plugin (loaded through ``modules``): provider ``hold``'s model streams "working" and
waits until its request is aborted when the prompt is "hold"; when it is "gate", it streams
"first" and waits until ``GATE`` is set; when it is "split", it streams its answer and its
reasoning in several deltas each; when it is "surrogate", it answers text holding a lone
surrogate and calls an unknown tool with one in its arguments, then (after the tool result)
answers "after"; it echoes anything else."""

import asyncio

from dsh_core import (
    Finish,
    PluginSpec,
    ReasoningDelta,
    ScriptedAdapter,
    ScriptedReply,
    ScriptedToolCall,
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


#: The lone surrogate a "surrogate" prompt's answer holds (what a model may stream).
LONE = "\ud800"


def _model(request):
    if request.last is not None and request.last.role == "tool":
        return "after"
    if request.last_user_text == "surrogate":
        call = ScriptedToolCall(name="nope", arguments={"agent_id": "x" + LONE}, id="c1")
        return ScriptedReply(text="bad " + LONE + " text", tool_calls=(call,))
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
