"""Which queued jobs a gfal worker tries first when it has free slots: the users take turns,
the one with fewest copies running here first, each user's jobs in their queue order (round
37: one user's jobs first in the queue had kept every later job of every user waiting)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping


def fair_order(candidates: Iterable[tuple[str, str]], running: Mapping[str, int]) -> list[str]:
    """The job ids of `candidates` ((job id, user) in queue order) in the order to try them:
    a user's n-th job here comes after every user's job that would be fewer copies in."""
    turn: Counter[str] = Counter(running)
    ranked = []
    for position, (job_id, user) in enumerate(candidates):
        ranked.append((turn[user], position, job_id))
        turn[user] += 1
    return [job_id for *_, job_id in sorted(ranked)]
