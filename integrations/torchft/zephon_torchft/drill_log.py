"""Reading the drill's attempt logs (``zephon_torchft.drill --log``) back as the samples of each committed step.

A committed step is found from the logs alone: the attempts of one step in one quorum (torchft's
``quorum_id``), at least one of which committed. Its samples are those of every participant of that
attempt, including a replica that died after the allreduce (its line is written before it dies): its
gradient and its lanes' positions went into the step. The participants' indices must be exactly
``0 .. P-1``, so an attempt with a participant missing from the logs cannot pass. The same reading
serves both loaders: a Zephon sample is ``(lane, lane_index, digest)``, a sampler's a document index.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_log(path: Path) -> list[dict[str, Any]]:
    """The lines of an attempt log written so far (a line still being written is left out)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def sample_key(sample: Any) -> Any:
    """A logged sample as a hashable value: ``[lane, lane_index, digest]`` -> a tuple, a document index as is."""
    return tuple(sample) if isinstance(sample, list) else sample


def committed_steps(logs: dict[int, list[dict[str, Any]]]) -> tuple[dict[int, list[Any]], list[str]]:
    """Each committed step's samples (sorted), and whatever makes the logs inconsistent with one commit per step."""
    groups: dict[tuple[int, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for rid, lines in logs.items():
        for line in lines:
            groups[(line["step"], line["quorum"])][rid] = line  # a replica's last attempt in that quorum
    steps: dict[int, list[Any]] = {}
    problems = []
    for (step, quorum), members in sorted(groups.items()):
        if not any(line["committed"] for line in members.values()):
            continue
        if step in steps:
            problems.append(f"step {step} committed in two quorums (the second: {quorum})")
            continue
        sizes = {line["participants"] for line in members.values()}
        indices = sorted(line["index"] for line in members.values() if line["index"] is not None)
        if len(sizes) != 1 or indices != list(range(next(iter(sizes)))):
            problems.append(f"step {step} (quorum {quorum}): participants {sorted(sizes)}, logged indices {indices}")
        steps[step] = sorted(sample_key(s) for line in members.values() if line["index"] is not None
                             for s in line["samples"])
    return steps, problems
