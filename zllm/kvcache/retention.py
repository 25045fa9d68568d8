"""The main-conversation rule: which kept state to evict next, in both tiers of both caches.

Least-recently-used alone loses the conversation the user is in. A coding agent sends short side requests
between its turns (Claude Code: the session title, the quota check, classifiers, subagents); each is newer than
the main conversation's last turn, so under a tight budget the side requests' states push out the long
system + tools + history prefix the next turn needs, and that turn prefills all of it again.

**Main conversation rule.** In each namespace, of the states used within the last `LIVE_S` seconds, the one
of a *continued* conversation (a later round, or a state a request already reused) that is longest — or, when
none was continued yet, the longest — is that namespace's main conversation, and is protected:

- eviction takes the least recently used unprotected state first, a protected one only when nothing else is left;
- a newcomer (a finished request's state asking for room) that is not itself its namespace's main conversation
  never evicts a protected one: it is not kept instead.

One state per namespace is protected, so the rule cannot pin the budget with more than a conversation per
caller, and a protected state is still evicted when a running request needs the room (a request must run).
The device tier (prefix_cache.py, on either backend's KV) and the one SSD store
(snapshot_store.py) choose their victims here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

# a conversation the user comes back to within the hour (Anthropic's longest prompt-cache TTL) is still theirs
LIVE_S = 3600.0


class Kept(Protocol):
    """What the rule reads of a kept state: a device entry or an SSD snapshot row of either cache."""

    namespace: str
    round: int  # 1: a conversation's first request; n: its n-th
    hits: int  # requests that reused this state
    last_used: float  # in the clock `now` is read from

    @property
    def length(self) -> int: ...


K = TypeVar("K", bound=Kept)


@dataclass(frozen=True)
class Newcomer:
    """A state that wants room but is not kept yet (the torch device tier makes room before it inserts)."""

    namespace: str
    length: int
    round: int
    last_used: float
    hits: int = 0


@dataclass(frozen=True)
class Eviction:
    victim: Kept | None  # what to evict next; None: stop (nothing evictable, or only states a newcomer may not take)
    spared: Kept | None = None  # the main conversation plain LRU would have evicted here instead (stats, log)


def main_conversations(kept: Iterable[K], now: float) -> dict[str, K]:
    """Each namespace's main conversation among `kept` (namespaces with nothing live have none)."""
    mains: dict[str, K] = {}
    for state in kept:
        if now - state.last_used > LIVE_S:
            continue
        best = mains.get(state.namespace)
        if best is None or _claim(state) > _claim(best):
            mains[state.namespace] = state
    return mains


def next_eviction(candidates: Sequence[K], kept: Iterable[K], now: float,
                  newcomer: Newcomer | None = None) -> Eviction:
    """The next state to evict among `candidates` (those free to go), judged against everything `kept`
    (and the `newcomer` that wants the room, if any)."""
    if not candidates:
        return Eviction(None)
    protected = {id(m) for m in main_conversations([*kept, *([newcomer] if newcomer else [])], now).values()}
    oldest = min(candidates, key=_age)
    others = [c for c in candidates if id(c) not in protected]
    if others:
        victim = min(others, key=_age)
        return Eviction(victim, oldest if victim is not oldest else None)
    if newcomer is not None and id(newcomer) not in protected:
        return Eviction(None, oldest)  # a side request's state is not worth a main conversation
    return Eviction(oldest)


def _claim(state: Kept) -> tuple[bool, int, float]:
    """Continued conversations first, then the longest, then the most recent."""
    return state.round > 1 or state.hits > 0, state.length, state.last_used


def _age(state: Kept) -> float:
    return state.last_used
