"""``ctx.subagents``: the provider registry and one-shot ``start`` (SVC-1..12)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
from dsh_core import AbortController, AbortSignal, Agent, ContextError, TextBlock, text_blocks
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import (
    NO_START_CAPABILITIES,
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableStartSpec,
    OneShotDescriptor,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentError,
    SubagentFollowupOptions,
    SubagentReportOptions,
    SubagentResult,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentRunInfo,
    SubagentService,
    SubagentStartRequest,
    UnsupportedSchemaError,
    descriptor_payload,
    snapshot_continuable_descriptor,
)

ALL = SubagentCapabilities(output_schema=True, depth_limit=True, tool_filter=True, persona=True)
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}
RunFactory = Callable[[ResolvedSubagentStartRequest], Awaitable[SubagentRun]]


async def _noop() -> None:
    return None


def fake_run(
    run_id: str = "child-1", *, local_agent: Agent | None = None
) -> tuple[SubagentRun, asyncio.Future[SubagentResult]]:
    """A run whose result the test settles by hand."""
    result: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
    return SubagentRun(id=run_id, local_agent=local_agent, result=result, dispose=_noop), result


class FakeProvider:
    """A provider recording every resolved request; ``factory`` builds its runs."""

    def __init__(
        self,
        name: str = "fake",
        capabilities: SubagentCapabilities = NO_START_CAPABILITIES,
        factory: RunFactory | None = None,
    ) -> None:
        self.name = name
        self.capabilities = capabilities
        self.inherits_parent_context = False
        self.requests: list[ResolvedSubagentStartRequest] = []
        self.runs: list[tuple[SubagentRun, asyncio.Future[SubagentResult]]] = []
        self._factory = factory

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        self.requests.append(request)
        if self._factory is not None:
            return await self._factory(request)
        made = fake_run()
        self.runs.append(made)
        return made[0]


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    events: list[Any]
    ended: asyncio.Event

    async def wait_end(self) -> None:
        """Wait (bounded) until a subagent/end was observed."""
        await asyncio.wait_for(self.ended.wait(), 5)

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    def request(self, **changes: Any) -> SubagentStartRequest:
        fields: dict[str, Any] = {
            "prompt": text_blocks("do it"),
            "parent": self.parent,
            "signal": AbortController().signal,
        }
        fields.update(changes)
        return SubagentStartRequest(**fields)

    def lifecycle(self) -> list[Any]:
        return [e for e in self.events if isinstance(e, SubagentRunInfo | SubagentRunEndInfo)]


@contextlib.asynccontextmanager
async def boot() -> AsyncIterator[Booted]:
    """A host with ``subagent`` mounted, a parent agent, and every lifecycle event recorded."""
    async with scripted_host("subagent", modules={"subagent": dsh_subagent.plugin}) as host:
        events: list[Any] = []
        for name in (
            "subagent/provider-added",
            "subagent/provider-removed",
            "subagent/start",
            "subagent/end",
        ):
            host.ctx.on(name, events.append)
        ended = asyncio.Event()
        host.ctx.on("subagent/end", lambda info: ended.set())
        parent = (await host.create_agent()).agent
        yield Booted(host=host, parent=parent, events=events, ended=ended)


# -- the registry (SVC-1..3) ---------------------------------------------------------------------


async def test_register_stores_then_announces() -> None:
    """SVC-1: register_provider stores the provider under its name, then emits provider-added."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        seen_registered: list[bool] = []
        b.host.ctx.on(
            "subagent/provider-added",
            lambda p: seen_registered.append(b.svc.get_provider(p.name) is p),
        )
        b.svc.register_provider(provider)
        assert b.svc.get_provider("alpha") is provider
        assert b.svc.list() == ["alpha"]
        assert provider in b.events
        assert seen_registered == [True]


async def test_added_listener_failure_rolls_back() -> None:
    """SVC-1: a throwing provider-added listener rolls the registration back; the error reaches
    the caller."""
    async with boot() as b:
        boom = RuntimeError("veto")

        def veto(provider: object) -> None:
            raise boom

        remove = b.host.ctx.on("subagent/provider-added", veto)
        with pytest.raises(RuntimeError) as caught:
            b.svc.register_provider(FakeProvider("alpha"))
        remove()
        assert caught.value is boom
        assert b.svc.get_provider("alpha") is None
        assert b.svc.list() == []


async def test_vetoed_name_can_be_registered_again() -> None:
    """SVC-1: after a vetoed registration the same name registers again, and the lifecycle
    checker (mounted by the host) records no violation."""
    async with boot() as b:

        def veto(provider: object) -> None:
            raise RuntimeError("veto")

        remove = b.host.ctx.on("subagent/provider-added", veto)
        with pytest.raises(RuntimeError):
            b.svc.register_provider(FakeProvider("alpha"))
        remove()
        again = FakeProvider("alpha")
        b.svc.register_provider(again)
        assert b.svc.get_provider("alpha") is again
        assert b.host.invariants.violations == []


async def test_duplicate_name_fails_synchronously_and_keeps_first() -> None:
    """SVC-2: a duplicate name raises DUPLICATE_PROVIDER synchronously; the first stays."""
    async with boot() as b:
        first = FakeProvider("alpha")
        b.svc.register_provider(first)
        with pytest.raises(SubagentError) as caught:
            b.svc.register_provider(FakeProvider("alpha"))
        assert caught.value.code == "DUPLICATE_PROVIDER"
        assert b.svc.get_provider("alpha") is first
        assert b.svc.list() == ["alpha"]
        assert [e for e in b.events if isinstance(e, FakeProvider)] == [first]


async def test_disposer_deletes_then_announces_removal() -> None:
    """SVC-3: the disposer deletes the name, then emits provider-removed(name)."""
    async with boot() as b:
        owner = b.host.ctx.plugin("owner")
        registration = owner[SUBAGENTS].register_provider(FakeProvider("alpha"))
        gone_at_event: list[bool] = []
        b.host.ctx.on(
            "subagent/provider-removed",
            lambda name: gone_at_event.append(b.svc.get_provider(name) is None),
        )
        registration()
        assert b.svc.get_provider("alpha") is None
        assert "alpha" in b.events
        assert gone_at_event == [True]
        registration()  # idempotent: no second removal event
        assert b.events.count("alpha") == 1


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot render me")


async def test_removal_listeners_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    """SVC-3: a sync throw, a rejected coroutine and an unprintable exception from
    provider-removed listeners are logged and never starve the other listeners."""
    async with boot() as b:
        owner = b.host.ctx.plugin("owner")
        owner[SUBAGENTS].register_provider(FakeProvider("alpha"))
        reached: list[str] = []

        def sync_throw(name: str) -> None:
            reached.append("sync")
            raise RuntimeError("sync listener failed")

        async def async_throw(name: str) -> None:
            reached.append("async")
            raise RuntimeError("async listener failed")

        def unprintable(name: str) -> None:
            reached.append("unprintable")
            raise _Unprintable

        for fn in (sync_throw, async_throw, unprintable):
            b.host.ctx.on("subagent/provider-removed", fn)
        b.host.ctx.on("subagent/provider-removed", lambda name: reached.append("last"))
        with caplog.at_level(logging.WARNING):
            await owner.dispose()
            await b.host.ctx.host.drain_tasks()
        assert reached == ["sync", "unprintable", "last", "async"]
        assert b.svc.get_provider("alpha") is None
        failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(failures) >= 3


# -- start: lookup and validation (SVC-4..7) -----------------------------------------------------


async def test_unknown_provider_rejects() -> None:
    """SVC-4: start on an unknown name rejects with NO_PROVIDER and emits nothing."""
    async with boot() as b:
        with pytest.raises(SubagentError) as caught:
            await b.svc.start("nobody", b.request())
        assert caught.value.code == "NO_PROVIDER"
        assert b.lifecycle() == []


async def test_start_racing_an_unloaded_provider() -> None:
    """SVC-4: a start issued while its provider is being unloaded rejects with NO_PROVIDER;
    the provider is never called and no publication event fires."""
    async with boot() as b:
        owner = b.host.ctx.plugin("owner")
        provider = FakeProvider("alpha")
        registration = owner[SUBAGENTS].register_provider(provider)
        pending = asyncio.ensure_future(b.svc.start("alpha", b.request()))
        registration()
        with pytest.raises(SubagentError) as caught:
            await pending
        assert caught.value.code == "NO_PROVIDER"
        assert provider.requests == []
        assert b.lifecycle() == []


_FULL: dict[str, Any] = {
    "output_schema": SCHEMA,
    "max_depth": 3,
    "tool_filter": None,  # filled in the test (a ToolRestriction)
    "persona": "you are terse",
}


@pytest.mark.parametrize(
    ("capabilities", "missing"),
    [
        (NO_START_CAPABILITIES, "output_schema"),
        (SubagentCapabilities(output_schema=True), "max_depth"),
        (SubagentCapabilities(output_schema=True, depth_limit=True), "tool_filter"),
        (
            SubagentCapabilities(output_schema=True, depth_limit=True, tool_filter=True),
            "persona",
        ),
    ],
)
async def test_capabilities_checked_in_order(
    capabilities: SubagentCapabilities, missing: str
) -> None:
    """SVC-5: capabilities are checked in the order output_schema, max_depth, tool_filter,
    persona; the first unsupported one rejects, provider.start is never called, no event."""
    from dsh_core import ToolRestriction

    async with boot() as b:
        provider = FakeProvider("alpha", capabilities)
        b.svc.register_provider(provider)
        request = b.request(**{**_FULL, "tool_filter": ToolRestriction(deny=("x",))})
        with pytest.raises(SubagentError) as caught:
            await b.svc.start("alpha", request)
        assert caught.value.code == "UNSUPPORTED_CAPABILITY"
        assert missing in str(caught.value)
        for other in {"output_schema", "max_depth", "tool_filter", "persona"} - {missing}:
            assert other not in str(caught.value)
        assert provider.requests == []
        assert b.lifecycle() == []


async def test_capability_check_precedes_value_validation() -> None:
    """SVC-5: an unsupported field is refused as UNSUPPORTED_CAPABILITY even when its value is
    invalid too (capabilities are checked before anything else)."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        for request in (b.request(max_depth=-1), b.request(output_schema={"type": "array"})):
            with pytest.raises(SubagentError) as caught:
                await b.svc.start("alpha", request)
            assert caught.value.code == "UNSUPPORTED_CAPABILITY"
        assert provider.requests == []


async def test_empty_persona_still_needs_the_capability() -> None:
    """SVC-5: a supplied-but-empty persona is still a persona request (checked, refused)."""
    async with boot() as b:
        b.svc.register_provider(FakeProvider("alpha", SubagentCapabilities(depth_limit=True)))
        with pytest.raises(SubagentError) as caught:
            await b.svc.start("alpha", b.request(persona=""))
        assert caught.value.code == "UNSUPPORTED_CAPABILITY"


@pytest.mark.parametrize("bad", [True, False, -1, 2**53, 2**60, 1.0, -0.0, "1", float("nan")])
async def test_invalid_max_depth_is_a_type_error(bad: object) -> None:
    """SVC-6, hardening 11.10: max_depth must be a non-negative safe integer (bools, negatives,
    > 2**53-1 and non-integers raise a TypeError naming max_depth) before provider.start."""
    async with boot() as b:
        provider = FakeProvider("alpha", ALL)
        b.svc.register_provider(provider)
        with pytest.raises(TypeError, match="max_depth must be a non-negative safe integer"):
            await b.svc.start("alpha", b.request(max_depth=bad))
        assert provider.requests == []
        assert b.lifecycle() == []


@pytest.mark.parametrize("good", [0, 1, 2**53 - 1])
async def test_valid_max_depth_reaches_the_provider(good: int) -> None:
    """SVC-6: 0 and 2**53-1 are valid max_depth values and pass through unchanged."""
    async with boot() as b:
        provider = FakeProvider("alpha", ALL)
        b.svc.register_provider(provider)
        await b.svc.start("alpha", b.request(max_depth=good))
        assert provider.requests[0].max_depth == good


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array"},
        {"properties": {}},
        {"type": "object", "$ref": "#/definitions/x"},
        {"type": "object", "properties": {"a": {"type": "date"}}},
        {"type": "object", "properties": {"a": {"if": True}}},
        {"type": "object", "properties": {"a": {"pattern": "("}}},
        {"type": "object", "required": "a"},
        [{"type": "object"}],
    ],
)
async def test_unsupported_schema_rejected_before_any_child(schema: object) -> None:
    """SVC-6: an output_schema outside the supported subset rejects with "unsupported JSON
    schema" before provider.start, so no child exists."""
    async with boot() as b:
        provider = FakeProvider("alpha", ALL)
        b.svc.register_provider(provider)
        agents = len(b.host.ctx.agents.list())
        sessions = len(b.host.ctx.sessions.list())
        with pytest.raises(Exception, match="unsupported JSON schema"):
            await b.svc.start("alpha", b.request(output_schema=schema))
        assert provider.requests == []
        assert len(b.host.ctx.agents.list()) == agents
        assert len(b.host.ctx.sessions.list()) == sessions
        assert b.lifecycle() == []


async def test_resolved_request_is_fresh_with_descriptor() -> None:
    """SVC-7: the provider gets a fresh resolved request: every caller field plus the one-shot
    descriptor naming the registry name and the label."""
    from dsh_core import AgentOptions, ToolRestriction

    async with boot() as b:
        provider = FakeProvider("alpha", ALL)
        b.svc.register_provider(provider)
        request = b.request(
            label="look around",
            agent_options=AgentOptions(model="m2"),
            output_schema=SCHEMA,
            max_depth=4,
            tool_filter=ToolRestriction(allow=("read",)),
            persona="terse",
        )
        await b.svc.start("alpha", request)
        (resolved,) = provider.requests
        assert resolved is not request
        assert isinstance(resolved, ResolvedSubagentStartRequest)
        for field in attrs.fields(SubagentStartRequest):
            assert getattr(resolved, field.name) is getattr(request, field.name) or getattr(
                resolved, field.name
            ) == getattr(request, field.name)
        assert resolved.parent is request.parent
        assert resolved.signal is request.signal
        assert resolved.descriptor == OneShotDescriptor(provider="alpha", label="look around")
        assert descriptor_payload(resolved.descriptor) == {
            "version": 2,
            "mode": "one-shot",
            "provider": "alpha",
            "label": "look around",
        }


async def test_descriptor_label_only_when_supplied() -> None:
    """SVC-7: without a label the descriptor carries no label key at all."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        await b.svc.start("alpha", b.request())
        payload = descriptor_payload(provider.requests[0].descriptor)
        assert payload == {"version": 2, "mode": "one-shot", "provider": "alpha"}
        assert "label" not in payload


async def test_label_less_descriptors_per_name_and_labels_kept() -> None:
    """SVC-7: label-less starts of one name carry equal descriptors, a labelled start between
    them keeps its own label, and another name carries its own provider."""
    async with boot() as b:
        alpha, beta = FakeProvider("alpha"), FakeProvider("beta")
        b.svc.register_provider(alpha)
        b.svc.register_provider(beta)
        await b.svc.start("alpha", b.request())
        await b.svc.start("alpha", b.request(label="named"))
        await b.svc.start("alpha", b.request())
        await b.svc.start("beta", b.request())
        assert [r.descriptor for r in alpha.requests] == [
            OneShotDescriptor(provider="alpha"),
            OneShotDescriptor(provider="alpha", label="named"),
            OneShotDescriptor(provider="alpha"),
        ]
        assert [r.descriptor for r in beta.requests] == [OneShotDescriptor(provider="beta")]


# -- provider outcome and lifecycle events (SVC-8..12) -------------------------------------------


async def test_provider_rejection_passes_through_without_events() -> None:
    """SVC-8: a rejection from provider.start passes through unchanged and emits nothing."""
    boom = LookupError("provider exploded")

    async def explode(request: ResolvedSubagentStartRequest) -> SubagentRun:
        raise boom

    async with boot() as b:
        b.svc.register_provider(FakeProvider("alpha", factory=explode))
        with pytest.raises(LookupError) as caught:
            await b.svc.start("alpha", b.request())
        assert caught.value is boom
        assert b.lifecycle() == []


async def test_start_returns_same_run_and_announces_it() -> None:
    """SVC-9: start returns the provider's very run object and emits subagent/start with a
    fresh run id, the registry name, the run id and locality."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        run = await b.svc.start("alpha", b.request())
        assert run is provider.runs[0][0]
        (start,) = b.lifecycle()
        assert isinstance(start, SubagentRunInfo)
        assert (start.provider, start.id, start.local) == ("alpha", "child-1", False)
        assert start.run_id and start.run_id != run.id


async def test_local_is_snapshotted_from_local_agent() -> None:
    """SVC-9: local is True exactly when the provider's run exposes a local agent."""
    async with boot() as b:

        async def local(request: ResolvedSubagentStartRequest) -> SubagentRun:
            run, result = fake_run("local-child", local_agent=b.parent)
            result.set_result(SubagentResult(output=(), stop_reason="completed"))
            return run

        b.svc.register_provider(FakeProvider("alpha", factory=local))
        await b.svc.start("alpha", b.request())
        start = b.lifecycle()[0]
        assert start.local is True


async def test_run_ids_unique_even_when_child_ids_repeat() -> None:
    """SVC-9: run ids are fresh per start even when the provider reuses the child id."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        for _ in range(5):
            await b.svc.start("alpha", b.request())
        starts = [e for e in b.lifecycle() if isinstance(e, SubagentRunInfo)]
        assert [s.id for s in starts] == ["child-1"] * 5
        assert len({s.run_id for s in starts}) == 5


async def test_no_event_while_provider_pending() -> None:
    """SVC-9: nothing is emitted while provider.start is still pending."""
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def slow(request: ResolvedSubagentStartRequest) -> SubagentRun:
        entered.set()
        await gate.wait()
        return fake_run()[0]

    async with boot() as b:
        b.svc.register_provider(FakeProvider("alpha", factory=slow))
        pending = asyncio.ensure_future(b.svc.start("alpha", b.request()))
        await entered.wait()
        assert b.lifecycle() == []
        gate.set()
        run = await pending
        assert [type(e) for e in b.lifecycle()] == [SubagentRunInfo]
        assert b.lifecycle()[0].id == run.id


async def test_end_pairs_with_start_and_carries_output() -> None:
    """SVC-10: subagent/end follows start with the same identity, the stop reason and the
    output as last_assistant_message."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        run = await b.svc.start("alpha", b.request())
        assert len(b.lifecycle()) == 1
        output = (TextBlock(text="done"),)
        provider.runs[0][1].set_result(SubagentResult(output=output, stop_reason="max-tokens"))
        await run.result
        await b.wait_end()
        start, end = b.lifecycle()
        assert isinstance(end, SubagentRunEndInfo)
        assert (end.run_id, end.provider, end.id, end.local) == (
            start.run_id,
            start.provider,
            start.id,
            start.local,
        )
        assert end.stop_reason == "max-tokens"
        assert end.last_assistant_message == output


async def test_end_follows_start_even_when_result_already_settled() -> None:
    """SVC-10: a run whose result settled before publication still emits start before end."""

    async def settled(request: ResolvedSubagentStartRequest) -> SubagentRun:
        run, result = fake_run()
        result.set_result(SubagentResult(output=(), stop_reason="completed"))
        return run

    async with boot() as b:
        b.svc.register_provider(FakeProvider("alpha", factory=settled))
        await b.svc.start("alpha", b.request())
        await b.wait_end()
        assert [type(e) for e in b.lifecycle()] == [SubagentRunInfo, SubagentRunEndInfo]


async def test_end_omits_empty_output() -> None:
    """SVC-10: last_assistant_message is omitted (None) when the output is empty."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        run = await b.svc.start("alpha", b.request())
        provider.runs[0][1].set_result(SubagentResult(output=(), stop_reason="completed"))
        await run.result
        await b.wait_end()
        end = b.lifecycle()[1]
        assert end.stop_reason == "completed"
        assert end.last_assistant_message is None


async def test_result_rejection_ends_with_error_and_still_rejects() -> None:
    """SVC-10: a rejected result emits end with stop_reason error and no message, while the
    caller's run.result still rejects with the fault."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        run = await b.svc.start("alpha", b.request())
        fault = OSError("transport died")
        provider.runs[0][1].set_exception(fault)
        with pytest.raises(OSError) as caught:
            await run.result
        assert caught.value is fault
        await b.wait_end()
        end = b.lifecycle()[1]
        assert end.stop_reason == "error"
        assert end.last_assistant_message is None


async def test_lifecycle_listeners_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    """SVC-11: throwing (sync, async, unprintable) subagent/start and subagent/end listeners are
    logged; the start still returns its run and other listeners still see both events."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)

        async def async_throw(info: object) -> None:
            raise RuntimeError("async listener failed")

        def unprintable(info: object) -> None:
            raise _Unprintable

        for name in ("subagent/start", "subagent/end"):
            b.host.ctx.on(name, _raise, prepend=True)
            b.host.ctx.on(name, async_throw, prepend=True)
            b.host.ctx.on(name, unprintable, prepend=True)
        with caplog.at_level(logging.WARNING):
            run = await b.svc.start("alpha", b.request())
            assert run is provider.runs[0][0]
            provider.runs[0][1].set_result(SubagentResult(output=(), stop_reason="completed"))
            await run.result
            await b.wait_end()
            await b.host.ctx.host.drain_tasks()
        assert [type(e) for e in b.lifecycle()] == [SubagentRunInfo, SubagentRunEndInfo]
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) >= 6


@contextlib.asynccontextmanager
async def unobserved() -> AsyncIterator[tuple[TestHost, Agent]]:
    """A host with ``subagent`` mounted, no lifecycle checker and no lifecycle listener."""
    async with scripted_host(
        "subagent", invariants=False, modules={"subagent": dsh_subagent.plugin}
    ) as host:
        yield host, (await host.create_agent()).agent


async def test_unobserved_start_pairs_a_later_end_listener() -> None:
    """SVC-9, SVC-10: with nobody listening at start, the same run is returned, and an end
    listener added while the run is live gets its identity with a fresh UUID run id."""
    async with unobserved() as (host, parent):
        provider = FakeProvider("alpha")
        host.ctx[SUBAGENTS].register_provider(provider)
        assert not host.ctx.has_listeners("subagent/start")
        request = SubagentStartRequest(
            prompt=text_blocks("do it"), parent=parent, signal=AbortController().signal
        )
        run = await parent.ctx[SUBAGENTS].start("alpha", request)
        assert run is provider.runs[0][0]
        ends: list[SubagentRunEndInfo] = []
        ended = asyncio.Event()
        host.ctx.on("subagent/end", lambda info: (ends.append(info), ended.set()))
        output = (TextBlock(text="done"),)
        provider.runs[0][1].set_result(SubagentResult(output=output, stop_reason="completed"))
        await asyncio.wait_for(ended.wait(), 5)
        (end,) = ends
        assert (end.provider, end.id, end.local, end.stop_reason) == (
            "alpha",
            "child-1",
            False,
            "completed",
        )
        assert end.last_assistant_message == output
        assert uuid.UUID(end.run_id).version == 4


async def test_unobserved_rejection_stays_on_the_result() -> None:
    """SVC-10: with no end listener a rejected result emits nothing and still rejects
    run.result with the fault."""
    async with unobserved() as (host, parent):
        provider = FakeProvider("alpha")
        host.ctx[SUBAGENTS].register_provider(provider)
        request = SubagentStartRequest(
            prompt=text_blocks("do it"), parent=parent, signal=AbortController().signal
        )
        run = await parent.ctx[SUBAGENTS].start("alpha", request)
        fault = OSError("transport died")
        provider.runs[0][1].set_exception(fault)
        with pytest.raises(OSError) as caught:
            await run.result
        assert caught.value is fault
        assert not host.ctx.has_listeners("subagent/end")


def _raise(info: object) -> None:
    raise RuntimeError("sync listener failed")


async def test_events_are_scoped_to_the_delegating_parent() -> None:
    """SVC-9: start/end are dispatched on the parent's scope: a listener scoped to one parent
    sees only that parent's delegations."""
    async with boot() as b:
        b.svc.register_provider(FakeProvider("alpha"))
        other = (await b.host.create_agent()).agent
        mine: list[Any] = []
        b.parent.ctx.on("subagent/start", mine.append)
        await other.ctx[SUBAGENTS].start("alpha", b.request(parent=other))
        assert mine == []
        await b.svc.start("alpha", b.request())
        assert len(mine) == 1


async def test_unregistering_blocks_starts_but_keeps_runs() -> None:
    """SVC-12: unregistering blocks new starts but never revokes a returned run; end still names
    the (removed) provider as provenance."""
    async with boot() as b:
        owner = b.host.ctx.plugin("owner")
        provider = FakeProvider("alpha")
        owner[SUBAGENTS].register_provider(provider)
        run = await b.svc.start("alpha", b.request())
        await owner.dispose()
        with pytest.raises(SubagentError) as caught:
            await b.svc.start("alpha", b.request())
        assert caught.value.code == "NO_PROVIDER"
        assert not run.result.done()
        provider.runs[0][1].set_result(
            SubagentResult(output=(TextBlock(text="late"),), stop_reason="completed")
        )
        assert (await run.result).stop_reason == "completed"
        await b.wait_end()
        assert b.lifecycle()[1].provider == "alpha"


async def test_register_on_disposed_context_fails() -> None:
    """SVC-1: registering through a disposed owner fails and stores nothing."""
    async with boot() as b:
        owner = b.host.ctx.plugin("owner")
        service = owner[SUBAGENTS]
        await owner.dispose()
        with pytest.raises(ContextError):
            service.register_provider(FakeProvider("alpha"))
        assert b.svc.get_provider("alpha") is None


# -- hardening 11.7, 11.10 and dx 12.4, 12.6 ------------------------------------------------------


def _recursive_schema() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    schema["properties"] = {"self": schema}
    return schema


def _nested(depth: int, key: str = "items") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", key: schema}
    return {"type": "object", "properties": {"a": schema}}


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "object", "pattern": 123}, id="pattern-not-a-string"),
        pytest.param({"type": "object", "minimum": "x"}, id="minimum-not-a-number"),
        pytest.param({"type": "object", "maximum": True}, id="maximum-bool"),
        pytest.param({"type": "object", "multipleOf": 0}, id="multipleOf-zero"),
        pytest.param({"type": "object", "minProperties": -1}, id="negative-count"),
        pytest.param({"type": "object", "maxProperties": 1.5}, id="fractional-count"),
        pytest.param({"type": "object", "uniqueItems": "yes"}, id="uniqueItems-not-bool"),
        pytest.param({"type": "object", "format": 5}, id="format-not-a-string"),
        pytest.param({"type": "object", "properties": {"a": {"maxLength": "9"}}}, id="nested"),
        pytest.param({"type": "object", "properties": {"a": {"type": {}}}}, id="type-object"),
        pytest.param({"type": "object", "enum": [{"a": float("nan")}]}, id="nan"),
        pytest.param(_recursive_schema(), id="recursive"),
        pytest.param(_nested(30), id="too-deep-to-compile"),
        pytest.param(_nested(5_000), id="deeper-than-the-stack"),
    ],
)
async def test_malformed_schema_is_unsupported_before_any_child(schema: object) -> None:
    """SVC-6, hardening 11.7: schema values the validator cannot use (a non-string pattern, a
    non-numeric bound, a recursive or too deeply nested schema, NaN) are UnsupportedSchemaError,
    "unsupported JSON schema", before provider.start: no child, no event."""
    async with boot() as b:
        provider = FakeProvider("alpha", ALL)
        b.svc.register_provider(provider)
        before = len(b.host.ctx.agents.list()), len(b.host.ctx.sessions.list())
        with pytest.raises(UnsupportedSchemaError, match="unsupported JSON schema"):
            await b.svc.start("alpha", b.request(output_schema=schema))
        assert provider.requests == []
        assert (len(b.host.ctx.agents.list()), len(b.host.ctx.sessions.list())) == before
        assert b.lifecycle() == []


async def test_unusable_schema_needs_the_capability_first() -> None:
    """SVC-5, hardening 11.7: a schema that is not even JSON (recursive) still meets the
    capability check first: UNSUPPORTED_CAPABILITY from a provider without output_schema."""
    async with boot() as b:
        b.svc.register_provider(FakeProvider("alpha"))
        with pytest.raises(SubagentError) as caught:
            await b.svc.start("alpha", b.request(output_schema=_recursive_schema()))
        assert caught.value.code == "UNSUPPORTED_CAPABILITY"


async def test_descriptor_exposes_version_like_mode() -> None:
    """SVC-7, hardening 11.10: the resolved request's descriptor exposes version (2) next to
    mode, as its payload does; so does a continuable descriptor."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        await b.svc.start("alpha", b.request())
        descriptor = provider.requests[0].descriptor
        assert (descriptor.version, descriptor.mode) == (2, "one-shot")
        payload = descriptor_payload(descriptor)
        assert (payload["version"], payload["mode"]) == (descriptor.version, descriptor.mode)
    continuable = snapshot_continuable_descriptor(provider="alpha", label="kept")
    assert (continuable.version, continuable.mode) == (2, "continuable")
    assert descriptor_payload(continuable)["version"] == continuable.version


async def test_signal_defaults_to_a_fresh_never_aborted_signal() -> None:
    """dx 12.4: a request without a signal gets its own fresh, never-aborted AbortSignal; the
    start goes through and the provider sees that signal."""
    async with boot() as b:
        provider = FakeProvider("alpha")
        b.svc.register_provider(provider)
        first = SubagentStartRequest(prompt=text_blocks("do it"), parent=b.parent)
        second = SubagentStartRequest(prompt=text_blocks("do it"), parent=b.parent)
        assert isinstance(first.signal, AbortSignal) and not first.signal.aborted
        assert first.signal is not second.signal
        run = await b.svc.start("alpha", first)
        assert provider.requests[0].signal is first.signal
        await run.dispose()


def test_continuable_request_types_default_their_signal() -> None:
    """dx 12.4: the continuable request types follow the same rule: signal defaults to a fresh,
    never-aborted AbortSignal per value."""
    from dsh_core import UserSource

    parent: Any = object()
    values = [
        lambda: ContinuableCreateRequest(session_id="s", parent=parent),
        lambda: ContinuableStartSpec(
            provider="p", label="l", prompt=text_blocks("x"), parent=parent
        ),
        lambda: SubagentFollowupOptions(source=UserSource()),
        lambda: SubagentReportOptions(delivery="quiet"),
    ]
    for make in values:
        one, two = make(), make()
        assert isinstance(one.signal, AbortSignal) and not one.signal.aborted
        assert one.signal is not two.signal


async def test_no_provider_lists_the_registered_ones() -> None:
    """SVC-4, dx 12.6: NO_PROVIDER names the registered providers (or says there are none)."""
    async with boot() as b:
        with pytest.raises(SubagentError, match=r"registered providers: none") as caught:
            await b.svc.start("nobody", b.request())
        assert caught.value.code == "NO_PROVIDER"
        b.svc.register_provider(FakeProvider("alpha"))
        b.svc.register_provider(FakeProvider("beta"))
        with pytest.raises(SubagentError) as caught:
            await b.svc.start("nobody", b.request())
        message = str(caught.value)
        assert message.startswith('no subagent provider is registered as "nobody"')
        assert 'registered providers: "alpha", "beta"' in message
        assert "dsh-subagent" not in message


@pytest.mark.parametrize(
    ("name", "distribution"),
    [
        ("spawn", "dsh-subagent-spawn"),
        ("fork", "dsh-subagent-fork"),
        ("acp", "dsh-subagent-acp"),
    ],
)
async def test_no_provider_names_the_distribution_of_a_known_name(
    name: str, distribution: str
) -> None:
    """SVC-4, dx 12.6: NO_PROVIDER for a well-known provider name says which distribution
    provides it."""
    async with boot() as b:
        with pytest.raises(SubagentError) as caught:
            await b.svc.start(name, b.request())
        assert caught.value.code == "NO_PROVIDER"
        assert f'"{name}" is provided by {distribution}' in str(caught.value)
