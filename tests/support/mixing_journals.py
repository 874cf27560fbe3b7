"""What the steered-run launches (TorchTitan's and Megatron's, tests/e2e) check of the two journals of a run and of
its resume under a schedule controller."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from zephon_core.curriculum.journal import DENOMINATOR, MixingJournal


def check_resumed_journal(journal: MixingJournal | None, resumed: MixingJournal | None,
                          schedule: Mapping[int, Sequence[int]], names: Sequence[str], replayed: int) -> None:
    """``resumed`` (the resume's final journal) holds ``journal``'s first ``replayed`` decisions whole and makes the
    others again, the same but for the digest of their inputs and the losses they journal (another data-parallel
    degree's losses differ in the last bits); every change of ``schedule`` is a decision at its weights."""
    assert journal is not None and resumed is not None
    assert journal.decisions[:replayed] == resumed.decisions[:replayed]
    assert [replace(d, inputs="", figures={}) for d in journal.decisions] == \
        [replace(d, inputs="", figures={}) for d in resumed.decisions]
    assert [d.step for d in journal.decisions] == sorted(schedule), "every scheduled change is a decision"
    for d in journal.decisions:
        total = sum(schedule[d.step])
        assert [d.weights[n] for n in names] == [w * DENOMINATOR // total for w in schedule[d.step]]


def steered_recipe(root: Path, names: Sequence[str], schedule: Mapping[int, Sequence[int]], *, lanes: int,
                   head: str = "") -> Path:
    """``root/steered.toml``: ``names``' token arrays in ``root`` (``token_corpora``) mixed 1:1:1 on ``lanes`` lanes,
    with a ``[mixing]`` schedule controller asked after every step that sets ``schedule`` (step -> weights)."""
    sources = "".join(f'[[sources]]\nname = "{n}"\npath = "{n}.npy"\nformat = "token_array"\n'
                      f'offsets = "{n}_offsets.npy"\nweight = 1.0\n\n' for n in names)
    (root / "decisions.toml").write_text("".join(
        f"[[decisions]]\nstep = {s}\nweights = {{ {', '.join(f'{n} = {w}' for n, w in zip(names, ws))} }}\n\n"
        for s, ws in schedule.items()))
    recipe = root / "steered.toml"
    recipe.write_text(f"seed = 11\nchunk_size = 4\ncanonical_replicas = {lanes}\n{head}\n[shuffle]\nwindow = 4\n"
                      "seed = 2\n\n" + sources
                      + '[mixing]\ncontroller = "schedule"\nschedule = "decisions.toml"\ninterval_steps = 1\n')
    return recipe
