"""Background jobs: per-owner cap, job_output / job_kill, ownership (BUG-7, host-core §13)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import attrs
import pytest

from dsh_core import AbortController, AbortSignal, Context, ToolDefinition, blocks_text
from dsh_core._agent import Agent
from dsh_core._jobs import JobError, JobService, JobSettlement
from dsh_core._tools import ToolExecutionInput, ToolExecutionResult
from dsh_core.testing import scripted_host


class Gate:
    """A producer that runs until released (or until its signal fires, if it listens)."""

    def __init__(self, output: str = "", *, honour_signal: bool = True) -> None:
        self.output = output
        self.honour_signal = honour_signal
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    def producer(self) -> Callable[[AbortSignal], Awaitable[JobSettlement]]:
        async def run(signal: AbortSignal) -> JobSettlement:
            self.started.set()
            waits = [asyncio.ensure_future(self.release.wait())]
            if self.honour_signal:
                waits.append(asyncio.ensure_future(signal.wait()))
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for p in pending:
                p.cancel()
            if signal.aborted:
                return JobSettlement(status="killed")
            return JobSettlement(status="completed", output=self.output)

        return run


async def run_tool(agent: Agent, name: str, **args: object) -> ToolExecutionResult:
    return await agent.ctx.tools.execute(
        ToolExecutionInput(
            call_id=f"call-{name}", name=name, arguments=args, signal=AbortSignal(), agent=agent
        )
    )


def add_job_starter(ctx: Context) -> None:
    """A global tool that starts jobs: every agent then sees job_output and job_kill."""

    async def body(args: object, run: object) -> str:
        return "ok"

    ctx.tools.register(
        ToolDefinition(name="starter", description="d", execute=body, starts_jobs=True)
    )


def text(result: ToolExecutionResult) -> str:
    return blocks_text(result.content)


async def test_per_owner_cap_refuses_without_minting_an_id() -> None:
    """BUG-7: past the per-owner cap start() fails JOB_LIMIT and creates no job id."""
    async with scripted_host(config={"jobs": {"cap": 2}}) as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        other = (await h.create_agent()).agent
        gates = [Gate("a"), Gate("b")]
        started = [
            jobs.start(kind="task", label=f"j{i}", owner=owner, producer=g.producer())
            for i, g in enumerate(gates)
        ]
        assert [j.id for j in started] == ["task-1", "task-2"]
        with pytest.raises(JobError) as err:
            jobs.start(kind="task", label="third", owner=owner, producer=Gate().producer())
        assert err.value.code == "JOB_LIMIT"
        assert sorted(jobs.jobs) == ["task-1", "task-2"]
        elsewhere = jobs.start(kind="task", label="x", owner=other, producer=Gate().producer())
        assert elsewhere.id == "task-3"
        gates[0].release.set()
        await started[0].wait()
        assert started[0].status == "completed"
        again = jobs.start(kind="task", label="again", owner=owner, producer=Gate().producer())
        assert again.id == "task-4"


async def test_a_stopping_job_still_holds_its_slot() -> None:
    """BUG-7: a killed job whose producer has not settled is `stopping` and keeps its slot."""
    async with scripted_host(config={"jobs": {"cap": 1}}) as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        stubborn = Gate(honour_signal=False)
        job = jobs.start(kind="task", label="slow", owner=owner, producer=stubborn.producer())
        await stubborn.started.wait()
        jobs.kill(job.id, owner=owner)
        assert job.status == "stopping"
        with pytest.raises(JobError) as err:
            jobs.start(kind="task", label="next", owner=owner, producer=Gate().producer())
        assert err.value.code == "JOB_LIMIT"
        stubborn.release.set()
        await job.wait()
        assert job.status == "killed"
        jobs.start(kind="task", label="next", owner=owner, producer=Gate().producer())


async def test_job_output_reports_new_output_and_status() -> None:
    """host-core §13: job_output renders `<output>\\n[status: completed]`, then only new output."""
    async with scripted_host() as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        gate = Gate("the answer")
        job = jobs.start(kind="task", label="t", owner=owner, producer=gate.producer())
        await gate.started.wait()
        running = await run_tool(owner, "job_output", job_id=job.id)
        assert text(running) == "(no new output)\n[status: running]"
        gate.release.set()
        done = await run_tool(owner, "job_output", job_id=job.id, wait=True)
        assert text(done) == "the answer\n[status: completed]"
        again = await run_tool(owner, "job_output", job_id=job.id)
        assert text(again) == "(no new output)\n[status: completed]"


async def test_job_kill_then_job_output_reports_killed() -> None:
    """host-core §13: after job_kill, job_output reads `(no new output)\\n[status: killed]`."""
    async with scripted_host() as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        gate = Gate("never")
        job = jobs.start(kind="task", label="t", owner=owner, producer=gate.producer())
        await gate.started.wait()
        killed = await run_tool(owner, "job_kill", job_id=job.id)
        assert text(killed) == f"job {job.id} is stopping"
        output = await run_tool(owner, "job_output", job_id=job.id, wait=True)
        assert text(output) == "(no new output)\n[status: killed]"
        again = await run_tool(owner, "job_kill", job_id=job.id)
        assert text(again) == f"job {job.id} already killed"


async def test_failed_producer_reports_failed_with_detail() -> None:
    """host-core §13: a producer that raises settles `failed` with the error as detail."""
    async with scripted_host() as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent

        async def broken(signal: AbortSignal) -> JobSettlement:
            raise RuntimeError("producer broke")

        job = jobs.start(kind="task", label="t", owner=owner, producer=broken)
        await job.wait()
        output = await run_tool(owner, "job_output", job_id=job.id)
        assert text(output) == "(no new output)\n[status: failed, RuntimeError: producer broke]"


async def test_job_tools_are_owner_only() -> None:
    """host-core §13: another agent cannot read or kill a job (UNAUTHORIZED); unknown ids fail."""
    async with scripted_host() as h:
        add_job_starter(h.ctx)  # so that the stranger sees the job tools too
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        stranger = (await h.create_agent()).agent
        gate = Gate("secret")
        job = jobs.start(kind="task", label="t", owner=owner, producer=gate.producer())
        for tool in ("job_output", "job_kill"):
            result = await run_tool(stranger, tool, job_id=job.id)
            assert result.error is not None and result.error.code == "UNAUTHORIZED"
        assert job.status == "running"
        unknown = await run_tool(owner, "job_output", job_id="task-99")
        assert unknown.error is not None and unknown.error.code == "UNKNOWN_JOB"
        no_agent = await h.ctx.tools.execute(
            ToolExecutionInput(
                call_id="c", name="job_output", arguments={"job_id": job.id}, signal=AbortSignal()
            )
        )
        assert no_agent.error is not None and no_agent.error.code == "NO_AGENT"
        gate.release.set()
        await job.wait()


async def test_owner_disposal_kills_its_jobs_only() -> None:
    """host-core §13: disposing an agent kills its unfinished jobs; other owners' jobs run on."""
    async with scripted_host() as h:
        jobs: JobService = h.ctx.jobs
        owner_handle = await h.create_agent()
        other = (await h.create_agent()).agent
        mine, theirs = Gate(), Gate("kept")
        job = jobs.start(kind="task", label="t", owner=owner_handle.agent, producer=mine.producer())
        kept = jobs.start(kind="task", label="t", owner=other, producer=theirs.producer())
        await owner_handle.dispose()
        await job.wait()
        assert job.status == "killed"
        assert kept.status == "running"
        theirs.release.set()
        await kept.wait()
        assert kept.status == "completed"


async def test_job_output_wait_stops_when_the_call_is_aborted_or_cancelled() -> None:
    """host-core §7/§13: job_output(wait) honours the call's signal and leaves no helper task."""
    async with scripted_host() as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        gate = Gate("late")
        job = jobs.start(kind="task", label="t", owner=owner, producer=gate.producer())
        in_body = asyncio.Event()

        async def mark(
            c: ToolExecutionInput, next_: Callable[[], Awaitable[ToolExecutionResult]]
        ) -> ToolExecutionResult:
            in_body.set()  # the body runs on without suspending until it waits for the job
            return await next_()

        owner.ctx.on("tools/execute", mark)
        controller = AbortController()
        call = ToolExecutionInput(
            call_id="c1",
            name="job_output",
            arguments={"job_id": job.id, "wait": True},
            signal=controller.signal,
            agent=owner,
        )
        waiting = asyncio.ensure_future(owner.ctx.tools.execute(call))
        await in_body.wait()
        controller.abort("stop waiting")
        result = await waiting
        assert result.error is not None and result.error.code == "ABORTED"
        assert job.status == "running"
        in_body.clear()
        cancelled = asyncio.ensure_future(
            owner.ctx.tools.execute(attrs.evolve(call, signal=AbortSignal()))
        )
        await in_body.wait()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        helpers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Job.wait"]
        assert all(t.done() or t.cancelling() for t in helpers)
        gate.release.set()
        await job.wait()
        assert job.status == "completed"


def tool_names(agent: Agent) -> list[str]:
    return [s.name for s in agent.ctx.tools.schemas()]


async def test_job_tools_are_hidden_where_no_agent_can_have_jobs() -> None:
    """host-core §13, tools 15.3: without a tool that starts jobs, job_output and job_kill are
    absent from the prompt and execute as UNKNOWN_TOOL."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        assert "job_output" not in tool_names(agent)
        assert "job_kill" not in tool_names(agent)
        result = await run_tool(agent, "job_output", job_id="task-1")
        assert result.error is not None and result.error.code == "UNKNOWN_TOOL"


async def test_job_tools_appear_beside_a_tool_that_starts_jobs() -> None:
    """host-core §13, tools 15.3: a visible tool with starts_jobs makes the job tools visible in
    that scope; a scope whose restriction hides it sees no job tools; removing it hides them."""
    from dsh_core import ToolRestriction

    async def body(args: object, run: object) -> str:
        return "ok"

    async with scripted_host() as h:
        h.ctx.tools.register(ToolDefinition(name="other", description="d", execute=body))
        remove = h.ctx.tools.register(
            ToolDefinition(name="starter", description="d", execute=body, starts_jobs=True)
        )
        agent = (await h.create_agent()).agent

        def hide(ctx: object) -> None:
            ctx.tools.restrict(ToolRestriction(deny=("starter",)))  # type: ignore[attr-defined]

        hidden = (await h.create_agent(setup=hide)).agent
        assert tool_names(agent) == ["job_output", "job_kill", "other", "starter"]
        assert tool_names(hidden) == ["other"]
        assert (await run_tool(hidden, "job_kill", job_id="x")).error.code == "UNKNOWN_TOOL"  # type: ignore[union-attr]
        remove()
        assert tool_names(agent) == ["other"]


async def test_a_job_owner_keeps_its_job_tools_in_its_own_scope() -> None:
    """host-core §13, tools 15.3: an agent's first job gives its own scope job_output and
    job_kill, so it can collect the job even where no visible tool starts jobs."""
    async with scripted_host() as h:
        jobs: JobService = h.ctx.jobs
        owner = (await h.create_agent()).agent
        bystander = (await h.create_agent()).agent
        gate = Gate("done")
        job = jobs.start(kind="task", label="j", owner=owner, producer=gate.producer())
        assert tool_names(owner) == ["job_output", "job_kill"]
        assert tool_names(bystander) == []
        jobs.start(kind="task", label="k", owner=owner, producer=Gate().producer())
        gate.release.set()
        result = await run_tool(owner, "job_output", job_id=job.id, wait=True)
        assert text(result) == "done\n[status: completed]"
