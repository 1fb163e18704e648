"""The system prompt: sections, shadowing, strict templates, runtime contexts (host-core §8)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import Context, ContextError, Message, PluginSource, Scope, SessionMeta
from dsh_core._context import Fiber, Host
from dsh_core._prompt import (
    PERSONA_SECTION,
    AssembleContext,
    PromptAssembly,
    PromptContext,
    PromptError,
    PromptSection,
    SystemPromptRegistry,
    SystemPromptService,
    _static_assembly,
    render_prompt,
)
from dsh_core.testing import scripted_host


def snapshots(ctx_events: object) -> list[str]:
    """The runtime-context snapshot messages of a log, in order."""
    out: list[str] = []
    for e in ctx_events:  # type: ignore[attr-defined]
        source = e.data.source if e.type == "user/message" else None
        if isinstance(source, PluginSource) and source.form == "snapshot":
            out.append(e.data.text)
    return out


def entered_batches(events: object) -> list[list[Message]]:
    """The user messages entered by each step/start, one list per step."""
    batches: list[list[Message]] = []
    for e in events:  # type: ignore[attr-defined]
        if e.type == "step/start":
            batches.append([])
        elif e.type == "user/message" and batches:
            batches[-1].append(e.data)
    return batches


# -- rendering --------------------------------------------------------------------------------


def test_render_substitutes_known_variables() -> None:
    """host-core §8: {{name}} (spaces allowed) is replaced by the variable's value."""
    assert render_prompt("model {{ model }} in {{cwd}}", {"model": "m1", "cwd": "/w"}) == (
        "model m1 in /w"
    )
    assert render_prompt("no variables", {}) == "no variables"


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("hello {{who}}", id="unknown"),
        pytest.param("hello {{none}}", id="valueless"),
        pytest.param("hello {{}}", id="empty-group"),
        pytest.param("hello {{two words}}", id="bad-name"),
        pytest.param("hello {{model", id="unclosed"),
        pytest.param("hello model}}", id="unopened"),
        pytest.param("{{model}} and {{", id="trailing-open"),
    ],
)
def test_render_is_strict(template: str) -> None:
    """host-core §8: unknown or valueless variables and malformed groups raise PROMPT_TEMPLATE."""
    with pytest.raises(PromptError) as err:
        render_prompt(template, {"model": "m1", "none": None})
    assert err.value.code == "PROMPT_TEMPLATE"


# -- sections ---------------------------------------------------------------------------------


async def test_sections_are_ordered_by_order_then_registration() -> None:
    """host-core §8: sections render by order band, ties in registration order."""
    async with scripted_host(config={"system-prompt": {"persona": "I am the persona."}}) as h:
        sp = h.ctx.system_prompt
        sp.section(PromptSection(name="guide-b", order=110, text="Tool guide B."))
        sp.section(PromptSection(name="identity", order=-100, text="Identity."))
        sp.section(PromptSection(name="guide-a", order=110, text="Tool guide A."))
        assembly = sp.assemble()
        assert [name for name, _ in assembly.sections] == [
            "identity",
            PERSONA_SECTION,
            "guide-b",
            "guide-a",
        ]
        assert assembly.system == "Identity.\n\nI am the persona.\n\nTool guide B.\n\nTool guide A."


async def test_empty_persona_is_dropped() -> None:
    """host-core §8: the deployment persona with empty text renders no section."""
    async with scripted_host() as h:
        assembly = h.ctx.system_prompt.assemble()
        assert assembly.sections == ()
        assert assembly.system == ""


async def test_scoped_persona_shadows_the_deployment_persona_for_one_agent_only() -> None:
    """host-core §8: a scoped deployment:persona replaces the global one for its agent alone."""
    async with scripted_host(config={"system-prompt": {"persona": "Deployment persona."}}) as h:

        def child_persona(ctx: Context) -> None:
            ctx.system_prompt.section(
                PromptSection(name=PERSONA_SECTION, order=0, text="Child persona.")
            )

        child = await h.create_agent(setup=child_persona)
        plain = await h.create_agent()
        await h.run(child.agent, "hi")
        await h.run(plain.agent, "hi")
        child_request, plain_request = h.model.requests
        assert child_request.system == "Child persona."
        assert plain_request.system == "Deployment persona."
        assert h.ctx.system_prompt.assemble().system == "Deployment persona."
        await child.dispose()
        again = await h.create_agent()
        await h.run(again.agent, "hi")
        assert h.model.requests[-1].system == "Deployment persona."


async def test_duplicate_section_in_one_layer_fails_and_changes_are_announced() -> None:
    """host-core §8: one name per layer; system-prompt/change fires on every registry change."""
    async with scripted_host() as h:
        changes: list[str] = []
        h.ctx.on("system-prompt/change", lambda: changes.append("change"))
        owner = h.ctx.plugin("owner")
        owner.system_prompt.section(PromptSection(name="s", order=1, text="x"))
        with pytest.raises(PromptError) as err:
            h.ctx.system_prompt.section(PromptSection(name="s", order=2, text="y"))
        assert err.value.code == "DUPLICATE_SECTION"
        owner.system_prompt.context(PromptContext(name="c", order=1, text="ctx"))
        owner.system_prompt.variable("v", lambda actx: "value")
        assert changes == ["change"] * 3
        await owner.dispose()
        assert changes == ["change"] * 6


async def test_unknown_variable_in_a_section_fails_assembly() -> None:
    """host-core §8: assembling a section naming an unknown variable raises PROMPT_TEMPLATE."""
    async with scripted_host() as h:
        h.ctx.system_prompt.section(PromptSection(name="s", order=1, text="hi {{nobody}}"))
        with pytest.raises(PromptError) as err:
            h.ctx.system_prompt.assemble()
        assert err.value.code == "PROMPT_TEMPLATE"


async def test_model_and_cwd_variables_render_per_agent(tmp_path: Path) -> None:
    """host-core §8: the loop registers `model` and `cwd`; without an agent they have no value."""
    async with scripted_host() as h:
        h.ctx.system_prompt.section(
            PromptSection(name="env", order=100, text="Model {{model}} working in {{cwd}}.")
        )
        handle = await h.create_agent(meta=SessionMeta(cwd=str(tmp_path)))
        await h.run(handle.agent, "hi")
        assert h.model.requests[0].system == f"Model scripted-1 working in {tmp_path}."
        with pytest.raises(PromptError) as err:
            h.ctx.system_prompt.assemble(AssembleContext())
        assert err.value.code == "PROMPT_TEMPLATE"


async def test_prompt_template_error_ends_the_turn_with_error() -> None:
    """host-core §8/§9: a section that cannot render fails the turn (error; the flattened
    UNKNOWN failure names PROMPT_TEMPLATE)."""
    async with scripted_host() as h:
        errors: list[BaseException] = []
        h.ctx.on("agent/error", lambda agent, exc: errors.append(exc))
        h.ctx.system_prompt.section(PromptSection(name="s", order=1, text="{{missing}}"))
        handle = await h.create_agent()
        await h.run(handle.agent, "hi")
        (end,) = [e.data for e in handle.agent.session.events if e.type == "turn/end"]
        assert end.reason.kind == "error"
        assert end.reason.error is not None and end.reason.error.code == "UNKNOWN"
        assert "[PROMPT_TEMPLATE]" in end.reason.error.message
        assert [type(e) for e in errors] == [PromptError]
        assert h.model.requests == []


# -- runtime contexts -------------------------------------------------------------------------


async def test_context_is_appended_as_a_snapshot_only_when_it_changes() -> None:
    """host-core §8: context text enters the batch as a snapshot message only when it changed."""
    async with scripted_host() as h:
        state = {"text": "Delegation: none running."}
        h.ctx.system_prompt.context(
            PromptContext(name="delegation", order=120, text=lambda actx: state["text"])
        )
        handle = await h.create_agent()
        agent = handle.agent
        await h.run(agent, "first")
        await h.run(agent, "second")
        state["text"] = "Delegation: one child running."
        await h.run(agent, "third")
        assert snapshots(agent.session.events) == [
            "Delegation: none running.",
            "Delegation: one child running.",
        ]
        batches = entered_batches(agent.session.events)
        assert sorted(m.text for m in batches[0]) == ["Delegation: none running.", "first"]
        assert [m.text for m in batches[1]] == ["second"]
        assert sorted(m.text for m in batches[2]) == ["Delegation: one child running.", "third"]


async def test_a_remembered_static_prompt_follows_every_change() -> None:
    """host-core §8: an unchanged static prompt is served again without rendering, yet any
    section change reaches the agent's next step, and computed text is never remembered."""
    async with scripted_host(config={"system-prompt": {"persona": "First."}}) as h:
        handle = await h.create_agent()
        agent = handle.agent
        await h.run(agent, "one")
        await h.run(agent, "two")
        assert agent.ctx.system_prompt.cached() is not None
        owner = h.ctx.plugin("owner")
        owner.system_prompt.section(PromptSection(name="extra", order=200, text="Extra."))
        assert agent.ctx.system_prompt.cached() is None
        await h.run(agent, "three")
        await owner.dispose()
        await h.run(agent, "four")
        state = {"n": 0}

        def counted(actx: AssembleContext) -> str:
            state["n"] += 1
            return f"Call {state['n']}."

        h.ctx.system_prompt.section(PromptSection(name="computed", order=300, text=counted))
        await h.run(agent, "five")
        await h.run(agent, "six")
        assert agent.ctx.system_prompt.cached() is None
        systems = [r.system for r in h.model.requests]
        assert systems == [
            "First.",
            "First.",
            "First.\n\nExtra.",
            "First.",
            "First.\n\nCall 1.",
            "First.\n\nCall 2.",
        ]


async def test_context_is_routed_by_scope() -> None:
    """host-core §8: a scoped context reaches only its own agent."""
    async with scripted_host() as h:

        def with_context(ctx: Context) -> None:
            ctx.system_prompt.context(PromptContext(name="mine", order=120, text="Only mine."))

        mine = await h.create_agent(setup=with_context)
        other = await h.create_agent()
        await h.run(mine.agent, "hi")
        await h.run(other.agent, "hi")
        assert snapshots(mine.agent.session.events) == ["Only mine."]
        assert snapshots(other.agent.session.events) == []
        assert h.ctx.system_prompt.assemble(AssembleContext(scope=Scope("x"))).context == ""


async def test_registration_through_a_disposed_context_is_refused_and_leaves_nothing() -> None:
    """host-core §9: a disposed scope cannot add sections, contexts or variables (nothing leaks)."""
    async with scripted_host() as h:
        gone = h.ctx.plugin("gone", scope=Scope("gone"))
        await gone.dispose()
        attempts = [
            lambda: gone.system_prompt.section(PromptSection(name="s", order=1, text="leak")),
            lambda: gone.system_prompt.context(PromptContext(name="c", order=1, text="leak")),
            lambda: gone.system_prompt.variable("v", lambda actx: "leak"),
        ]
        for attempt in attempts:
            with pytest.raises(ContextError) as err:
                attempt()
            assert err.value.code == "INACTIVE_EFFECT"
        assembly = h.ctx.system_prompt.assemble(AssembleContext(scope=gone.scope))
        assert (assembly.sections, assembly.context) == ((), "")
        h.ctx.system_prompt.section(PromptSection(name="probe", order=2, text="{{v}}"))
        with pytest.raises(PromptError):  # `v` must not have been left in the dead scope
            h.ctx.system_prompt.assemble(AssembleContext(scope=gone.scope))


# -- the static fast path (hypothesis) ----------------------------------------------------------

_PLAIN = st.sampled_from(["", "  ", "Alpha.", " Beta. ", "Gamma\n"])
_TEXTS = st.one_of(_PLAIN, st.sampled_from(["{{v}}", "w={{w}}", "odd }}"]))
_NAMES = st.sampled_from(["a", "b", "c", PERSONA_SECTION])
_ORDERS = st.sampled_from([-100, 0, 0, 120])
_ENTRY = st.tuples(_NAMES, _ORDERS, st.one_of(_TEXTS, _TEXTS.map(lambda t: lambda _actx: t)))
_PLAIN_ENTRY = st.tuples(_NAMES, _ORDERS, _PLAIN)


def _entries(max_size: int) -> st.SearchStrategy[list[Any]]:
    """Entry lists, often all plain strings (the fast path's case)."""
    return st.one_of(st.lists(_PLAIN_ENTRY, max_size=max_size), st.lists(_ENTRY, max_size=max_size))


def _register(registry: SystemPromptRegistry, sections: list[Any], contexts: list[Any]) -> None:
    """Register the first entry of each name (a layer holds a name once)."""
    seen: set[str] = set()
    for name, order, text in sections:
        if name not in seen:
            seen.add(name)
            registry.section(PromptSection(name=name, order=order, text=text))
    seen.clear()
    for name, order, text in contexts:
        if name not in seen:
            seen.add(name)
            registry.context(PromptContext(name=name, order=order, text=text))


def _outcome(assemble: Callable[[], PromptAssembly]) -> PromptAssembly | str:
    try:
        return assemble()
    except PromptError as exc:
        return exc.code


@settings(max_examples=300, deadline=None)
@given(
    global_sections=_entries(4),
    global_contexts=_entries(3),
    own_sections=_entries(3),
    own_contexts=_entries(3),
    own_variable=st.booleans(),
)
def test_static_fast_path_equals_the_general_assembly(
    global_sections: list[Any],
    global_contexts: list[Any],
    own_sections: list[Any],
    own_contexts: list[Any],
    own_variable: bool,
) -> None:
    """host-core §8: an agent scope's assembly built from the cached global one (plain-string
    own entries) equals the general rendering: same sections, order, shadowing, contexts,
    variables, and the same PROMPT_TEMPLATE failures."""
    svc = SystemPromptService()
    host = Host()
    glob = SystemPromptRegistry(svc, Context(host, Fiber("global")))
    glob.variable("v", lambda _actx: "vee")
    glob.variable("w", lambda _actx: None)
    _register(glob, global_sections, global_contexts)
    scope = Scope("agent")
    own = SystemPromptRegistry(svc, Context(host, Fiber("agent"), scope))
    if own_variable:
        own.variable("v", lambda _actx: "own")
    _register(own, own_sections, own_contexts)
    actx = AssembleContext(scope=scope)

    general = _outcome(lambda: own._assemble(actx, svc.effective_scope(scope)))
    svc.cache.drop(None)
    _outcome(glob.assemble)  # caches the global assembly when it is static
    assert _outcome(lambda: own.assemble(actx)) == general
    assert _outcome(lambda: own.assemble(actx)) == general  # and from the cache


def test_static_fast_path_serves_a_plain_scoped_context() -> None:
    """host-core §8: a scope adding only plain-string entries is assembled from the cached
    global assembly (no re-render), and its result is cached for the scope."""
    svc = SystemPromptService()
    host = Host()
    glob = SystemPromptRegistry(svc, Context(host, Fiber("global")))
    glob.section(PromptSection(name=PERSONA_SECTION, order=0, text=" Persona. "))
    base = glob.assemble()
    scope = Scope("agent")
    own = SystemPromptRegistry(svc, Context(host, Fiber("agent"), scope))
    own.context(PromptContext(name="ctx", order=120, text="Delegated."))
    fast = _static_assembly(svc, scope, base)
    assert fast == PromptAssembly(
        system="Persona.",
        sections=((PERSONA_SECTION, "Persona."),),
        context="Delegated.",
        variables={},
    )
    assert own.assemble(AssembleContext(scope=scope)) == fast
    assert svc.cache.get(scope) == fast
