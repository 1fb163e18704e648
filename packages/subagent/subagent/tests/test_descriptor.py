"""The ``subagent/descriptor`` vocabulary: snapshot, payload, parse, fold (DSC-1..3, DSC-6)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import SessionEvent, ToolRestriction, freeze_json, is_lossless_json
from dsh_subagent import (
    DESCRIPTOR_EVENT,
    SUBAGENT_DESCRIPTOR_VERSION,
    ContinuableDescriptor,
    DescriptorError,
    OneShotDescriptor,
    descriptor_payload,
    fold_descriptor,
    parse_descriptor,
    snapshot_continuable_descriptor,
    snapshot_one_shot_descriptor,
)

ONE_SHOT = {"version": 2, "mode": "one-shot", "provider": "spawn"}
CONTINUABLE = {"version": 2, "mode": "continuable", "provider": "fork", "label": "review"}


# -- DSC-1 and DSC-6: snapshots ------------------------------------------------------------------


def test_version_is_two() -> None:
    """DSC-1: the current descriptor version is 2."""
    assert SUBAGENT_DESCRIPTOR_VERSION == 2
    assert DESCRIPTOR_EVENT == "subagent/descriptor"


def test_one_shot_snapshot_omits_absent_label() -> None:
    """DSC-1: a one-shot snapshot without a label has no label key."""
    assert descriptor_payload(snapshot_one_shot_descriptor("spawn")) == ONE_SHOT
    assert descriptor_payload(snapshot_one_shot_descriptor("spawn", "x")) == {
        **ONE_SHOT,
        "label": "x",
    }


def test_continuable_snapshot_omits_absent_fields() -> None:
    """DSC-1: a continuable snapshot carries only the optional fields that were given."""
    bare = snapshot_continuable_descriptor(provider="fork", label="review")
    assert descriptor_payload(bare) == CONTINUABLE
    full = snapshot_continuable_descriptor(
        provider="fork",
        label="review",
        agent_provider="scripted",
        agent_model="m1",
        persona="",
        tool_filter=ToolRestriction(deny=("bash",)),
    )
    assert descriptor_payload(full) == {
        **CONTINUABLE,
        "agent_provider": "scripted",
        "agent_model": "m1",
        "persona": "",
        "tool_filter": {"deny": ["bash"]},
    }


@pytest.mark.parametrize("bad", [5, 1.5, b"bytes", ["x"], {"k": "v"}])
def test_snapshot_refuses_non_lossless_input(bad: Any) -> None:
    """DSC-1: non-string (not losslessly JSON-serializable) input throws before any child."""
    with pytest.raises(DescriptorError, match="not losslessly JSON-serializable"):
        snapshot_one_shot_descriptor("spawn", bad)
    with pytest.raises(DescriptorError, match="not losslessly JSON-serializable"):
        snapshot_one_shot_descriptor(bad)
    with pytest.raises(DescriptorError, match="not losslessly JSON-serializable"):
        snapshot_continuable_descriptor(provider="fork", label="l", persona=bad)
    with pytest.raises(DescriptorError, match="not losslessly JSON-serializable"):
        snapshot_continuable_descriptor(
            provider="fork", label="l", tool_filter=ToolRestriction(allow=(bad,))
        )


def test_descriptor_never_stores_composition_inputs() -> None:
    """DSC-6: no depth, output schema, max tokens or whole agent options in any payload."""
    forbidden = {"subagent_depth", "subagentDepth", "output_schema", "max_tokens", "agent_options"}
    full = snapshot_continuable_descriptor(
        provider="fork",
        label="l",
        agent_provider="p",
        agent_model="m",
        persona="x",
        tool_filter=ToolRestriction(allow=("a",), deny=("b",)),
    )
    for descriptor in (full, snapshot_one_shot_descriptor("spawn", "l")):
        assert not set(descriptor_payload(descriptor)) & forbidden
    assert set(descriptor_payload(full)) == {
        "version",
        "mode",
        "provider",
        "label",
        "agent_provider",
        "agent_model",
        "persona",
        "tool_filter",
    }


# -- DSC-2: the parser table ---------------------------------------------------------------------

MALFORMED: list[tuple[str, object]] = [
    ("not an object: list", [ONE_SHOT]),
    ("not an object: string", "descriptor"),
    ("not an object: null", None),
    ("not an object: number", 2),
    ("version missing", {"mode": "one-shot", "provider": "p"}),
    ("version a string", {**ONE_SHOT, "version": "2"}),
    ("version null", {**ONE_SHOT, "version": None}),
    ("version a boolean", {**ONE_SHOT, "version": True}),
    ("mode missing", {"version": 2, "provider": "p"}),
    ("mode unknown", {**ONE_SHOT, "mode": "forever"}),
    ("mode null", {**ONE_SHOT, "mode": None}),
    ("one-shot with persona", {**ONE_SHOT, "persona": "x"}),
    ("one-shot with tool_filter", {**ONE_SHOT, "tool_filter": {"allow": []}}),
    ("one-shot extra key", {**ONE_SHOT, "extra": 1}),
    ("continuable extra key", {**CONTINUABLE, "extra": 1}),
    ("camelCase key", {**CONTINUABLE, "toolFilter": {"allow": []}}),
    ("provider missing", {"version": 2, "mode": "one-shot"}),
    ("provider a number", {**ONE_SHOT, "provider": 5}),
    ("provider null", {**ONE_SHOT, "provider": None}),
    ("continuable label missing", {k: v for k, v in CONTINUABLE.items() if k != "label"}),
    ("continuable label a number", {**CONTINUABLE, "label": 5}),
    ("continuable label null", {**CONTINUABLE, "label": None}),
    ("one-shot label a number", {**ONE_SHOT, "label": 5}),
    ("one-shot label null (present, not a string)", {**ONE_SHOT, "label": None}),
    ("persona a number", {**CONTINUABLE, "persona": 1}),
    ("persona null", {**CONTINUABLE, "persona": None}),
    ("agent_model a list", {**CONTINUABLE, "agent_model": ["m"]}),
    ("tool_filter a list", {**CONTINUABLE, "tool_filter": ["a"]}),
    ("tool_filter null", {**CONTINUABLE, "tool_filter": None}),
    ("tool_filter empty", {**CONTINUABLE, "tool_filter": {}}),
    ("tool_filter extra key", {**CONTINUABLE, "tool_filter": {"allow": [], "only": []}}),
    ("tool_filter allow a string", {**CONTINUABLE, "tool_filter": {"allow": "a"}}),
    ("tool_filter deny of numbers", {**CONTINUABLE, "tool_filter": {"deny": [1]}}),
    ("tool_filter allow null", {**CONTINUABLE, "tool_filter": {"allow": None}}),
]


@pytest.mark.parametrize("payload", [p for _, p in MALFORMED], ids=[w for w, _ in MALFORMED])
def test_malformed_payloads_are_errors(payload: object) -> None:
    """DSC-2: every malformed current-version payload raises DescriptorError."""
    with pytest.raises(DescriptorError):
        parse_descriptor(payload)
    with pytest.raises(DescriptorError):
        parse_descriptor(freeze_json(payload))


@pytest.mark.parametrize("version", [1, 3, 2.5, -2, 10**20])
def test_other_versions_are_unsupported(version: object) -> None:
    """DSC-2: a numeric version other than 2 is unsupported: None, never an error, whatever
    else the payload holds."""
    assert parse_descriptor({"version": version}) is None
    assert parse_descriptor({**CONTINUABLE, "version": version, "junk": [1]}) is None


VALID: list[tuple[dict[str, Any], object]] = [
    (ONE_SHOT, OneShotDescriptor(provider="spawn")),
    ({**ONE_SHOT, "label": "x"}, OneShotDescriptor(provider="spawn", label="x")),
    ({**ONE_SHOT, "version": 2.0}, OneShotDescriptor(provider="spawn")),
    (CONTINUABLE, ContinuableDescriptor(provider="fork", label="review")),
    (
        {**CONTINUABLE, "tool_filter": {"allow": []}},
        ContinuableDescriptor(
            provider="fork", label="review", tool_filter=ToolRestriction(allow=())
        ),
    ),
    (
        {
            **CONTINUABLE,
            "agent_provider": "scripted",
            "agent_model": "m",
            "persona": "",
            "tool_filter": {"allow": ["a"], "deny": ["b"]},
        },
        ContinuableDescriptor(
            provider="fork",
            label="review",
            agent_provider="scripted",
            agent_model="m",
            persona="",
            tool_filter=ToolRestriction(allow=("a",), deny=("b",)),
        ),
    ),
]


@pytest.mark.parametrize(("payload", "expected"), VALID)
def test_valid_payloads_parse(payload: dict[str, Any], expected: object) -> None:
    """DSC-2: valid payloads (plain or frozen) parse to the matching descriptor."""
    assert parse_descriptor(payload) == expected
    assert parse_descriptor(freeze_json(payload)) == expected


# -- DSC-2 as a property: the parser never raises anything but DescriptorError --------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False).filter(is_lossless_json)
    | st.text(max_size=6)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.lists(st.text(max_size=4), max_size=3)
near_filter = st.one_of(
    st.fixed_dictionaries({}, optional={"allow": names | json_values, "deny": names | json_values}),
    st.fixed_dictionaries({"allow": names}, optional={"extra": json_values}),
    json_values,
)
near_descriptor = st.fixed_dictionaries(
    {
        "version": st.sampled_from([2, 2.0, 1, 3, "2", None, True]) | json_values,
        "mode": st.sampled_from(["one-shot", "continuable", "One-Shot", ""]) | json_values,
    },
    optional={
        "provider": st.text(max_size=6) | json_values,
        "label": st.text(max_size=6) | json_values,
        "agent_provider": st.text(max_size=6) | json_values,
        "agent_model": st.text(max_size=6) | json_values,
        "persona": st.text(max_size=6) | json_values,
        "tool_filter": near_filter,
        "extra": json_values,
    },
)


def _parse_or_error(payload: object) -> object:
    try:
        return parse_descriptor(payload)
    except DescriptorError:
        return DescriptorError


@given(json_values)
def test_parse_arbitrary_json_raises_only_descriptor_error(payload: object) -> None:
    """DSC-2: on arbitrary JSON the parser returns a descriptor or None, or raises
    DescriptorError, and nothing else."""
    outcome = _parse_or_error(payload)
    assert (
        outcome is None
        or outcome is DescriptorError
        or isinstance(outcome, OneShotDescriptor | ContinuableDescriptor)
    )


@given(near_descriptor)
def test_parse_near_valid_descriptors(payload: dict[str, Any]) -> None:
    """DSC-2: on near-valid descriptor dicts the parser raises only DescriptorError, frozen and
    plain forms agree, and anything it accepts round-trips through descriptor_payload."""
    outcome = _parse_or_error(payload)
    assert _parse_or_error(freeze_json(payload)) == outcome
    if outcome is None:
        version = payload["version"]
        assert type(version) in (int, float) and version != 2
    elif outcome is not DescriptorError:
        assert isinstance(outcome, OneShotDescriptor | ContinuableDescriptor)
        assert parse_descriptor(descriptor_payload(outcome)) == outcome
        assert outcome.provider == payload["provider"]


# -- DSC-3: the fold reads the first descriptor of the log's own suffix ---------------------------


def _event(seq: int, type: str, data: object = None) -> SessionEvent:
    return SessionEvent(type=type, seq=seq, time=0, data=freeze_json(data), ignorable=True)


def test_fold_takes_first_descriptor_of_own_suffix() -> None:
    """DSC-3: the fold skips descriptors inside the seed and takes the first one after it."""
    ancestor = {**ONE_SHOT, "provider": "ancestor"}
    events = [
        _event(0, DESCRIPTOR_EVENT, ancestor),
        _event(1, "note", {}),
        _event(2, DESCRIPTOR_EVENT, CONTINUABLE),
        _event(3, DESCRIPTOR_EVENT, {**CONTINUABLE, "label": "second"}),
    ]
    fold = fold_descriptor(events, seed_length=2)
    assert fold.status == "ok"
    assert fold.seq == 2
    assert fold.descriptor == ContinuableDescriptor(provider="fork", label="review")
    unseeded = fold_descriptor(events, seed_length=None)
    assert unseeded.descriptor == OneShotDescriptor(provider="ancestor")
    assert unseeded.seq == 0


def test_fold_reports_none_and_unsupported() -> None:
    """DSC-3: only seed descriptors -> none; an unknown version first in the suffix ->
    unsupported; a malformed current one -> DescriptorError."""
    seeded_only = [_event(0, DESCRIPTOR_EVENT, ONE_SHOT), _event(1, "note", {})]
    assert fold_descriptor(seeded_only, seed_length=1).status == "none"
    future = [_event(0, DESCRIPTOR_EVENT, {"version": 3}), _event(1, DESCRIPTOR_EVENT, ONE_SHOT)]
    unsupported = fold_descriptor(future, seed_length=0)
    assert (unsupported.status, unsupported.seq, unsupported.descriptor) == ("unsupported", 0, None)
    with pytest.raises(DescriptorError):
        fold_descriptor([_event(0, DESCRIPTOR_EVENT, {**ONE_SHOT, "mode": 7})], seed_length=None)
