"""The compiled-validator cache behind tool schemas is bounded (host-core §7, hardening 11.9)."""

from __future__ import annotations

from typing import Any

from dsh_core import VALIDATOR_CACHE_SIZE, compile_schema, freeze_json
from dsh_core._tools import _compiled


def _schema(n: int) -> Any:
    return freeze_json({"type": "object", "properties": {f"p{n}": {"const": n}}})


def test_the_cache_stays_bounded_and_still_hits() -> None:
    """host-core §7, hardening 11.9: compiling many distinct schemas never keeps more than
    VALIDATOR_CACHE_SIZE validators; a recently used schema is still a hit (the same
    validator), and one that fell out is compiled again and works."""
    assert VALIDATOR_CACHE_SIZE == 256
    _compiled.cache_clear()
    kept = compile_schema(_schema(-1))
    for n in range(3 * VALIDATOR_CACHE_SIZE):
        compile_schema(_schema(n))
        if n % 64 == 0:
            assert compile_schema(_schema(-1)) is kept
        assert _compiled.cache_info().currsize <= VALIDATOR_CACHE_SIZE
    info = _compiled.cache_info()
    assert info.currsize == VALIDATOR_CACHE_SIZE
    assert info.hits >= 3 * VALIDATOR_CACHE_SIZE // 64
    assert compile_schema(_schema(-1)) is kept
    again = compile_schema(_schema(0))
    assert again({"p0": 0}) == {"p0": 0}
    assert _compiled.cache_info().misses == info.misses + 1


def test_equal_schemas_share_one_validator() -> None:
    """host-core §7, hardening 11.9: equal schemas (frozen or plain) share one compiled
    validator."""
    plain = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert compile_schema(plain) is compile_schema(freeze_json(plain))  # type: ignore[arg-type]
