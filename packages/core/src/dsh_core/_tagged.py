"""Merge-extensible tagged unions for durable values (content blocks, message sources, chunks).

A base class names its tag field (``type`` or ``kind``); each variant is an attrs subclass
whose tag field has a fixed default. Plugins add variants before any log is loaded. A tag no
variant claims round-trips losslessly as the union's *unknown* variant instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import attrs

from ._errors import DshError

__all__ = ["TaggedUnion", "TaggedUnionError"]

B = TypeVar("B")


class TaggedUnionError(DshError, ValueError):
    """A variant conflicts with one already registered, or a payload has no usable tag."""

    code = "TAGGED_UNION"


class TaggedUnion(Generic[B]):
    """The registry of one union: tag value -> variant class."""

    def __init__(
        self,
        base: type[B],
        tag: str,
        unknown: Callable[[str, Mapping[str, Any]], B],
        unknown_type: type[B],
    ) -> None:
        self.base = base
        self.tag = tag
        self.unknown = unknown
        self.unknown_type = unknown_type
        self.variants: dict[str, type[B]] = {}

    def tag_of(self, cls: type[B]) -> str:
        """The fixed tag value of variant ``cls``."""
        field = attrs.fields_dict(cls).get(self.tag)  # type: ignore[arg-type]
        if field is None or not isinstance(field.default, str):
            raise TaggedUnionError(f"{cls.__name__} has no fixed {self.tag!r} default")
        return field.default

    def register(self, cls: type[B]) -> type[B]:
        """Add a variant (idempotent for the same class); usable as a class decorator."""
        value = self.tag_of(cls)
        known = self.variants.get(value)
        if known is not None and known is not cls:
            raise TaggedUnionError(
                f"{self.base.__name__} {self.tag} {value!r} is already {known.__qualname__}, "
                f"cannot also be {cls.__qualname__}"
            )
        self.variants[value] = cls
        return cls

    def variant(self, value: str) -> type[B] | None:
        """The class registered for ``value``, if any."""
        return self.variants.get(value)
