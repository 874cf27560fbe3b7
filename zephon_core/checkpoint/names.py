"""Every file name of the aggregation protocol, in one place.

``<aggregate_dir>/<run_id>/`` holds:

``round.json``
    the round the leader opened without announcing it (a launch's first, a retry
    after a failed round): its token, who writes, ``open`` or ``closed``;
``part-<rank>.json``
    a writer's contribution to the current round (its own state, or the merge of
    the ranks below it in the tree); one per writer, overwritten in place at each
    round (a header line with the SHA-256 of the rest: a torn one is never taken);
``merged-<token>.json``
    round ``<token>``'s merged state, or a note that the round was replaced;
``.tmp-*``
    the leader's write in flight on a filesystem (round.json, merged files),
    renamed into place once complete.
"""

from __future__ import annotations

import re
import uuid

from zephon_core.io import atomic

ROUND_FILE = "round.json"
TMP_PREFIX = atomic.TMP_PREFIX  # what atomic.write_atomically names a write in flight
_TOKEN = re.compile(r"[0-9a-f]{32}")
_PART = re.compile(r"part-(0|[1-9][0-9]*)\.json")


def new_token() -> str:
    """A fresh round token: 128 random bits, never used by an earlier round or launch."""
    return uuid.uuid4().hex


def is_token(value: object) -> bool:
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def part_file(rank: int) -> str:
    return f"part-{rank}.json"


def merged_file(token: str) -> str:
    return f"merged-{token}.json"


def rank_of_part(name: str) -> int | None:
    m = _PART.fullmatch(name)
    return int(m.group(1)) if m else None
