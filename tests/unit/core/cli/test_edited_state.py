"""Every command that reads a state checks it as a restore does (issue #40, item 8): a hand-edited state (one lane's
``delivered`` 2 -> 3, the checksum left as it was) is refused by each, in one line naming the file, before any
output; none shows it as if it were the run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon

ROOT = Path(__file__).resolve().parents[4]
DEMO = str(ROOT / "configs" / "data" / "demo.toml")


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """The demo run's merged state after 2 global steps of 8 batches on 2 groups (every lane delivered 2), and a
    copy with lane 0's ``delivered`` edited to 3."""
    from zephon_core.recipe import load_recipe
    from zephon_core.verify.simulate import Phase, run_phase

    def make(G: int, g: int):
        return load_recipe(DEMO).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)

    _, state = run_phase(make, Phase(2, 2), 8, None)
    out = tmp_path_factory.mktemp("edited")
    good, edited = out / "state.json", out / "edited.json"
    good.write_text(json.dumps(state))
    assert state["lanes"]["0"]["delivered"] == 2
    state["lanes"]["0"]["delivered"] = 3
    edited.write_text(json.dumps(state))
    return good, edited


def _commands(good: Path, edited: Path) -> dict[str, list[str]]:
    e = str(edited)
    return {
        "inspect": ["inspect", e],
        "inspect --json": ["inspect", e, "--json"],
        "report": ["report", e],
        "skip (print)": ["skip", "--state", e],
        "skip": ["skip", "--state", e, "--steps", "4..5", "--batches-per-step", "8"],
        "quarantine": ["quarantine", DEMO, "--state", e, "--document", "stdlib_docs.jsonl#5"],
        "ledger": ["ledger", DEMO, "--state", e, "--batches-per-step", "8"],
        "trace": ["trace", DEMO, "--journal", e, "--step", "1", "--canonical-replicas", "8"],
        "verify-elastic": ["verify-elastic", DEMO, "--journal", e, "--canonical-replicas", "8", "--from", "2",
                           "--to", "4", "--checkpoint-step", "1", "--steps", "2"],
        "explain": ["explain", DEMO, "--journal", e],
        "diff (states)": ["diff", str(good), e],
        "diff (state, recipe)": ["diff", e, DEMO],
    }


@pytest.mark.parametrize("name", list(_commands(Path("a"), Path("b"))))
def test_an_edited_state_is_refused_by_every_reader_naming_the_file(states, name):
    good, edited = states
    before = edited.read_bytes()
    r = zephon(*_commands(good, edited)[name])
    assert r.returncode == 1, f"{name} accepted the edited state:\n{r.stdout[-1500:]}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(edited) in lines[0] and "checksum does not match" in lines[0], r.stderr
    assert "pass a state Zephon wrote, unchanged" in lines[0]
    assert r.stdout == ""  # refused before anything is shown
    assert edited.read_bytes() == before  # and nothing rewritten


def test_the_unedited_state_is_read(states):
    good, _ = states
    for args in (["inspect", str(good)], ["skip", "--state", str(good)], ["report", str(good)]):
        r = zephon(*args)
        assert r.returncode == 0, r.stderr
