"""Named components chosen by a config string: one `Registry` per kind of component.

A registry maps names to entries (functions, classes) in registration order and reads like a
read-only dict: `name in registry`, `registry[name]`, `sorted(registry)`, `list(registry)`,
`registry.items()`. Entries join with the `register(name)` decorator:

    KL_ESTIMATORS = Registry("KL estimator")

    @KL_ESTIMATORS.register("k1")
    def kl_k1(logp, ref_logp): ...

Looking up an unknown name raises `UnknownNameError`, whose message names the kind, the name
and the known names; registering a name twice raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name no entry of a registry has.

    A ValueError (a bad config value) that is also the KeyError a dict lookup raises, so
    `Mapping.get` and code written against the former plain dicts keep working.
    """

    def __str__(self) -> str:
        # KeyError's own str() would print the message in quotes.
        return str(self.args[0])


class Registry(Mapping[str, T]):
    """Entries of one kind by name, in registration order.

    kind: what the entries are, for error messages ("segmenter", "KL estimator").
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator that registers its target under `name` and returns it unchanged."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._entries[name]!r})")
            self._entries[name] = entry
            return entry

        return add

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable "name"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}") from None

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._entries)})"
