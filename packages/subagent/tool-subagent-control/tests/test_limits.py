"""``send_message`` and the run tree's cap (ROB-68): a follow-up that would cold-resume a
settled child into a full tree is the seam's SUBAGENT_LIMIT refusal, as an errored result."""

from __future__ import annotations

from types import SimpleNamespace


async def test_send_message_into_a_full_tree_is_refused_and_resumes_later(
    kit: SimpleNamespace,
) -> None:
    """ROB-68: with the tree's one slot held, send_message to a settled child is an errored
    result (SUBAGENT_LIMIT) whose text says the child was not resumed and what to do; once
    the slot is free the same call resumes it."""
    async with kit.boot(config={"subagent": {"max_running_children_per_tree": 1}}) as b:
        done = await b.start("first")
        await b.settled(done)
        busy = await b.start("hold busy")
        refused = await b.call("send_message", {"subagent_id": done, "message": "more"})
        assert refused.error is not None and refused.error.code == "SUBAGENT_LIMIT"
        assert kit.text(refused) == (
            "Error: subagent limit reached: this run tree already has the maximum number of "
            "running subagents (max_running_children_per_tree = 1); subagent "
            f"{done} was not resumed. Wait for one of them to finish, then try again."
        )
        b.model.release("hold busy")
        await b.settled(busy)
        accepted = await b.call("send_message", {"subagent_id": done, "message": "more"})
        assert accepted.error is None
        await b.settled(done)
