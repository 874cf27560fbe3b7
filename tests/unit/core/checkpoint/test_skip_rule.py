"""One skip rule (issue #40, item 9): the same request through every way of asking for a skip (``zephon skip`` on a
JSON state, a recipe's ``[surgery]`` table through ``apply_surgery``, ``Pipeline.skip_steps``, Megatron's start-up
journal) gives the same journal or the same refusal. A skip journaled identically is a no-op, even after the lanes
passed it (a recipe's table stays in the recipe on later resumes); one overlapping a journaled skip without being it,
or of steps already delivered, is refused naming the steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon

from zephon_core.checkpoint.state import parse_lanes, skip_in_state
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import StateError
from zephon_core.pipeline.surgery import SurgeryRequest, apply_surgery
from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[4]
DEMO = ROOT / "configs" / "data" / "demo.toml"  # canonical_replicas 8: at 8 batches a step, one a lane a step
B = 8


def _make(G: int, g: int):
    return load_recipe(DEMO).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)


@pytest.fixture(scope="module")
def states():
    """The demo run after 2 global steps on 2 groups with steps 4..5 journaled (``early``: every lane delivered 2),
    and the same run resumed for 4 more trained steps, past the skip (``late``: steps 3, 6, 7, 8; delivered 8)."""
    from zephon_core.verify.simulate import Phase, run_phase

    _, state = run_phase(_make, Phase(2, 2), B, None)
    early = skip_in_state(state, 4, 5, B)
    _, late = run_phase(_make, Phase(4, 4), B, early)
    assert {ls.delivered for ls in parse_lanes(late).values()} == {8}
    return {"early": early, "late": late}


def _by_cli(state, first, last, batches, tmp: Path):
    path, out = tmp / "state.json", tmp / "out.json"
    path.write_text(json.dumps(state))
    r = zephon("skip", "--state", str(path), "--steps", f"{first}..{last}", "--batches-per-step", str(batches),
               "--out", str(out))
    if r.returncode:
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        raise StateError(r.stderr.strip())
    return surgery_journal_of(json.loads(out.read_text())).skips


def _by_recipe(state, first, last, batches, tmp: Path):
    text = DEMO.read_text().replace('"../corpus/', f'"{ROOT / "configs" / "corpus"}/')
    (tmp / "run.toml").write_text(text + f'\n[surgery]\nskip_steps = ["{first}..{last}"]\n')
    recipe = load_recipe(str(tmp / "run.toml"))
    with recipe.build_standalone(dp_degree=1, dp_group_id=0, prefetch=0) as p:
        p.restore(state)
        apply_surgery(p, recipe.surgery(), batches)
        return p.surgery.skips


def _by_pipeline(state, first, last, batches, tmp: Path):
    with _make(1, 0) as p:
        p.restore(state)
        p.skip_steps(first, last, batches)
        return p.surgery.skips


def _by_megatron(state, first, last, batches, tmp: Path):
    surgery = pytest.importorskip("zephon_megatron.surgery")
    request = SurgeryRequest(((first, last),), where="r.toml: surgery")
    try:
        journal = surgery_journal_of(state)
        return surgery._add(journal, request, batches, state["canonical_replicas"], parse_lanes(state)).skips
    except surgery.ZephonMegatronError as e:
        raise StateError(str(e)) from None


WAYS = {"zephon skip": _by_cli, "recipe [surgery]": _by_recipe, "Pipeline.skip_steps": _by_pipeline,
        "Megatron": _by_megatron}

# state, request, and what every way must answer: the skips journaled after it, or the words of the refusal.
CASES = {
    "the same skip again": ("early", (4, 5, B), ["steps 4..5"]),
    "the same skip after the lanes passed it": ("late", (4, 5, B), ["steps 4..5"]),
    "a new skip": ("early", (7, 8, B), ["steps 4..5", "steps 7..8"]),
    "overlapping": ("early", (5, 6, B), "cannot skip steps 5..6 (1 batches a lane a step): the journal already skips "
                                        "steps 4..5 (1 a lane a step), which overlaps it; ask for exactly steps 4..5"),
    "the same steps, other batches": ("early", (4, 5, 2 * B), "cannot skip steps 4..5 (2 batches a lane a step): the "
                                                              "journal already skips steps 4..5 (1 a lane a step)"),
    "steps already delivered": ("early", (2, 3, B), "cannot skip steps 2..3: lane 0 already delivered 2 batches"),
    "overlapping and delivered": ("late", (5, 9, B), "cannot skip steps 5..9: lane 0 already delivered 8 batches"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_way_of_asking_for_a_skip_answers_alike(states, case, tmp_path):
    which, (first, last, batches), expected = CASES[case]
    answers = {}
    for way, ask in WAYS.items():
        try:
            answers[way] = [str(s) for s in ask(states[which], first, last, batches, tmp_path)]
        except StateError as e:
            message = str(e)
            answers[way] = message[message.find("cannot skip"):] if "cannot skip" in message else message
    if isinstance(expected, list):
        assert answers == {way: expected for way in WAYS}, answers
    else:
        assert all(isinstance(a, str) and a.startswith(expected) for a in answers.values()), answers
        assert len(set(answers.values())) == 1, answers  # the one rule's one message, whichever way was asked
