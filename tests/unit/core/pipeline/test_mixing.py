"""A mixture the run steers (pipeline/mixing.py, curriculum/{controllers,journal,steered}.py): decisions become
stages at a chunk no lane has read, the journal in the state is replayed on resume at any data-parallel degree,
every global step equals the uninterrupted run over the same journal, and ranks that decide differently are
refused at the merge."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StateError, StaticMixture
from zephon_core.checkpoint.merge import merge_states
from zephon_core.curriculum.controller_registry import controller_from
from zephon_core.curriculum.controllers import (
    IdentityController,
    MixingInputs,
    OdmController,
    ScheduleController,
    bounded,
)
from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.journal import DENOMINATOR, Decision, MixingJournal, parse_journal, quantize
from zephon_core.curriculum.steered import with_journal
from zephon_core.errors import ConfigError
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.verify.curriculum_audit import audit_curriculum
from zephon_core.verify.simulate import Phase, StepRecord, first_mismatch, run_phase

C = 4
NAMES = ("s0", "s1", "s2")


def sources():
    rng = np.random.default_rng(3)
    return [MemorySource([[i * 1000 + d] * (1 + int(rng.integers(0, 20))) for d in range(n)], name=f"s{i}")
            for i, n in enumerate([60, 45, 50])]


def base():
    return StaticMixture(sources(), [1, 1, 1], seed=4, chunk_size=12)


def pipe(ws, G=1, gid=0, prefetch=0):
    return (Pipeline(ws).pack(8).shuffle(3).batch(2)
            .options(canonical_replicas=C, dp_degree=G, dp_group_id=gid, prefetch=prefetch, readahead=2))


def loss_of(step: int) -> tuple[list[float], list[int]]:
    """A deterministic stand-in for the reduced per-source losses of a step."""
    return [1.0 + (step % 3), 2.0, 3.0 - (step % 2)], [10, 10, 10]


def steered_run(controller_factory, phases, *, interval=1, prefetch=0, state=None, step0=0):
    """Run ``phases`` with a steered mixture, deciding as the adapters would; the records, the merged state,
    the final journal and the decisions every group made (identical across groups, checked)."""
    records: list[StepRecord] = []
    step = [step0]

    def make(G, gid):
        mixing = Mixing(controller_factory(), interval_steps=interval, min_share=0.02)
        return MixingLoader(pipe(base(), G, gid, prefetch), mixing)

    def after(loaders):
        step[0] += 1
        for ld in loaders:
            ld.record_loss(*loss_of(step[0]))
        if loaders[0].due(step[0]):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            made = [ld.decide(step[0], figures) for ld in loaders]
            assert all(d == made[0] for d in made)
            journals.append(loaders[0].journal)

    journals: list[MixingJournal] = [MixingJournal()]
    for phase in phases:
        recs, state = run_phase(make, phase, C, state, after_step=after)
        state = json.loads(json.dumps(state))
        records.extend(recs)
    return records, state, journals[-1]


def reference(journal: MixingJournal, steps: int) -> list[StepRecord]:
    recs, _ = run_phase(lambda G, g: pipe(with_journal(base(), journal), G, g), Phase(1, steps), C, None)
    return recs


schedules = st.lists(
    st.tuples(st.integers(1, 40), st.lists(st.integers(1, 20), min_size=3, max_size=3)), min_size=1, max_size=5)


def schedule_controller(entries):
    return lambda: ScheduleController([(s, dict(zip(NAMES, w))) for s, w in entries])


@pytest.mark.topology
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules, st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 15)), min_size=1, max_size=3))
def test_every_step_of_a_steered_run_equals_the_uninterrupted_run_over_its_journal(entries, phases):
    """Random decisions at random steps, checkpoints and resizes: every global step is the replay reference's, and
    no document repeats within a source epoch."""
    phases = [Phase(G, n) for G, n in phases]
    steps = sum(p.steps for p in phases)
    records, state, journal = steered_run(schedule_controller(entries), phases)
    assert parse_definition(state["definition"]).work_source.journal == (journal if journal.decisions else None)
    ref = reference(journal, steps)
    assert first_mismatch(records, ref, provenance=True) is None
    ws = with_journal(base(), journal)
    audit = audit_curriculum(ws, max(int(k) + v["cursor"][0] * C + 1 for k, v in state["lanes"].items()))
    assert not audit.problems, audit.problems


def test_prefetch_and_read_ahead_never_change_the_decisions_or_the_data():
    entries = [(3, [1, 5, 1]), (7, [6, 1, 1]), (12, [1, 1, 9])]
    runs = [steered_run(schedule_controller(entries), [Phase(2, 20)], prefetch=p) for p in (0, 4)]
    assert runs[0][2] == runs[1][2] and len(runs[0][2].decisions) == 3
    assert first_mismatch(runs[0][0], runs[1][0], provenance=True) is None


def test_a_resume_replays_the_journal_and_continues_the_controller_on_another_degree():
    records, state, journal = steered_run(lambda: OdmController(0.5), [Phase(4, 12)], interval=3)
    assert journal.decisions, "the losses differ per source: ODM must move the weights"
    resumed, _, after = steered_run(lambda: OdmController(0.5), [Phase(2, 12)], interval=3, state=state, step0=12)
    assert after.decisions[: len(journal.decisions)] == journal.decisions
    assert first_mismatch(records + resumed, reference(after, 24), provenance=True) is None
    whole, _, uninterrupted = steered_run(lambda: OdmController(0.5), [Phase(1, 24)], interval=3)
    assert uninterrupted == after  # the controller's journaled state carried it on as if never stopped


def test_realized_token_shares_follow_the_journal_weights():
    entries = [(2, [1, 3, 6])]
    records, state, journal = steered_run(schedule_controller(entries), [Phase(1, 300)], interval=1)
    (decision,) = journal.decisions
    ws = with_journal(base(), journal)
    tokens: Counter[int] = Counter()
    lengths = [src.token_lengths() for src in ws.sources]
    for chunk in ws.chunks(list(range(decision.start_chunk, decision.start_chunk + 200))):
        for s, d in zip(chunk.sources.tolist(), chunk.documents.tolist()):
            tokens[s] += int(lengths[s][d])
    total = sum(tokens.values())
    for s, name in enumerate(NAMES):
        assert abs(tokens[s] / total - decision.weights[name] / DENOMINATOR) < 0.01
    # What the lanes delivered under the decision's stage (their tallies, stage 1 after the recipe's one).
    delivered = [sum(lane["tally"]["tokens"][1][s] for lane in state["lanes"].values()) for s in range(3)]
    assert sum(delivered) > 20_000
    for s, name in enumerate(NAMES):
        assert abs(delivered[s] / sum(delivered) - decision.weights[name] / DENOMINATOR) < 0.01


def test_a_rank_that_decided_differently_is_refused_at_the_merge_naming_it_and_the_decision():
    _, state, journal = steered_run(schedule_controller([(2, [1, 3, 6]), (5, [5, 1, 1])]), [Phase(2, 8)])
    groups = []
    for gid, weights in enumerate([(2000, 3000, 5000), (2001, 2999, 5000)]):
        d = journal.decisions[1]
        other = MixingJournal((journal.decisions[0], Decision(d.step, d.start_chunk, dict(zip(NAMES, weights)),
                                                        d.controller, d.params, d.inputs, d.state)))
        p = pipe(with_journal(base(), other), 2, gid)
        groups.append(p.local_state())
    with pytest.raises(StateError) as e:
        merge_states(groups, labels=["global rank 0", "global rank 1"])
    msg = str(e.value)
    assert "\n" not in msg and "global rank 1 decided the steered mixture differently from global rank 0" in msg
    assert "decision 1: step 5" in msg and "s0 0.2," in msg and "s0 0.2001," in msg


def test_a_stage_at_a_chunk_a_lane_has_read_is_refused_loudly():
    p = pipe(base())
    it = iter(p)
    for _ in range(40):
        next(it)
    assert p.read_frontier() > 3
    late = MixingJournal((Decision(40, 3, {"s0": 5000, "s1": 5000, "s2": 0}, "identity"),))
    with pytest.raises(StateError, match="changes the data from global chunk 3"):
        p.switched(with_journal(base(), late))


def test_quantized_weights_sum_exactly_and_bounds_hold():
    assert sum(quantize([1 / 3, 1 / 3, 1 / 3])) == DENOMINATOR
    assert quantize([0.1, 0.2, 0.7]) == quantize([1, 2, 7]) == (1000, 2000, 7000)
    out = bounded([0.5, 0.3, 0.2], [0, 0, 1], min_share=0.05, max_change=0.1)
    assert abs(sum(out) - 1) < 1e-12 and max(abs(a - b) for a, b in zip(out, [0.5, 0.3, 0.2])) <= 0.1 + 1e-12
    assert min(bounded([0.4, 0.3, 0.3], [0, 0, 1], 0.05, 1.0)) >= 0.05 - 1e-12


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=8).filter(lambda w: sum(w) > 0))
def test_quantize_is_a_partition_of_the_denominator(shares):
    q = quantize(shares)
    assert sum(q) == DENOMINATOR and all(x >= 0 for x in q)
    total = sum(shares)
    assert all(abs(x - s / total * DENOMINATOR) < 1 for x, s in zip(q, shares))


def test_odm_moves_weight_to_the_source_with_the_higher_loss_and_its_state_round_trips():
    odm = OdmController(alpha=0.5)
    shares = (1 / 3,) * 3
    for step in range(1, 30):
        target = odm.propose(MixingInputs(step, NAMES, (1.0, 1.0, 4.0), (1, 1, 1), (0, 0, 0), shares))
        shares = tuple(bounded(shares, target, 0.0, 1.0))
    assert shares[2] > 0.4 and shares[0] < 0.3
    copy = OdmController(alpha=0.5)
    copy.load_state(json.loads(json.dumps(odm.state())))
    nxt = MixingInputs(30, NAMES, (1.0, 2.0, 1.0), (1, 1, 1), (0, 0, 0), shares)
    assert copy.propose(nxt) == odm.propose(nxt)


def test_controllers_from_recipe_keys_and_schedule_files(tmp_path):
    path = tmp_path / "mix.toml"
    path.write_text("[[decisions]]\nstep = 10\nweights = { s0 = 1, s2 = 3 }\n")
    sched = controller_from({"controller": "schedule", "schedule": "mix.toml"}, base=tmp_path)
    assert sched.propose(MixingInputs(9, NAMES, (0,) * 3, (0,) * 3, (0,) * 3, (1,) * 3)) is None
    assert sched.propose(MixingInputs(10, NAMES, (0,) * 3, (0,) * 3, (0,) * 3, (1,) * 3)) == [1.0, 0.0, 3.0]
    assert isinstance(controller_from({"controller": "identity", "weights": {"s0": 1}}), IdentityController)
    mixing = Mixing.from_table({"controller": "odm", "alpha": 0.8, "interval_steps": 50, "max_change": 0.1})
    assert mixing.controller.params() == {"alpha": 0.8} and mixing.max_change == 0.1
    for table, needle in [({"controller": "dorem"}, "mixing.controller must be one of"),
                          ({"controller": "odm", "weights": {}}, "mixing.weights is not a key of controller 'odm'"),
                          ({"controller": "odm", "interval_step": 5}, "mixing.interval_step is not a mixing key"),
                          ({"controller": "odm"}, "give exactly one of interval_steps and interval_tokens")]:
        with pytest.raises(ConfigError, match=needle):
            Mixing.from_table(table)
    path.write_text("[[decisions]]\nstep = 10\n")
    with pytest.raises(ConfigError, match="needs \\[\\[decisions\\]\\] tables of step and weights"):
        ScheduleController.from_file(path)


def test_a_malformed_journal_is_refused_naming_the_field():
    good = MixingJournal((Decision(5, 9, {"s0": 4000, "s1": 6000}, "odm", {"alpha": 0.9}, "ab", {"t": 1}),)).to_json()
    assert parse_journal(json.loads(json.dumps(good))).to_json() == good
    bad = json.loads(json.dumps(good))
    bad["decisions"][0]["weights"]["s1"] = 5999
    with pytest.raises(StateError, match=r"journal.decisions\[0\].weights: must be integers summing to 10000"):
        parse_journal(bad)


def test_each_decision_journals_the_figures_it_decided_on_rounded_and_read_back_from_the_state():
    """The record of why: each decision keeps the interval's per-source mean loss (6 significant digits) and loss
    tokens, as the controller saw them (loss_of over the interval's steps, 2 groups' figures as recorded)."""
    _, state, journal = steered_run(schedule_controller([(3, [1, 3, 6]), (6, [5, 1, 1])]), [Phase(2, 9)], interval=3)
    assert [d.step for d in journal.decisions] == [3, 6]
    for d in journal.decisions:
        steps = range(d.step - 2, d.step + 1)
        sums = [sum(loss_of(s)[0][i] for s in steps) for i in range(3)]
        assert d.figures == {"mean_loss": {n: float(f"{x / 30:.6g}") for n, x in zip(NAMES, sums)},
                             "loss_tokens": dict.fromkeys(NAMES, 30)}
        assert d.mean_loss("s0") == d.figures["mean_loss"]["s0"] and d.inputs
    assert parse_definition(state["definition"]).journal == journal  # through the state's JSON, unchanged
    thirds = MixingInputs(1, NAMES, (1.0, 2.0, 0.0), (3, 3, 0), (0, 0, 0), (0.5, 0.5, 0))
    assert thirds.figures()["mean_loss"] == {"s0": 0.333333, "s1": 0.666667, "s2": None}
    bad = journal.to_json()
    bad["decisions"][0]["figures"]["mean_loss"]["s0"] = "high"
    with pytest.raises(StateError, match=r"journal.decisions\[0\].figures.mean_loss: must be numbers or null"):
        parse_journal(bad)


def test_the_checkpoint_aggregation_names_a_rank_that_decided_otherwise(tmp_path):
    """Two ranks (one per data-parallel group) through the real aggregation: equal decisions merge, across the
    pipeline rebuilt at each decision; a rank whose second decision differs is refused, named with it."""
    import threading

    from zephon_core import AggregationError

    schedule = [(2, dict(zip(NAMES, [1, 3, 6]))), (6, dict(zip(NAMES, [5, 1, 1])))]
    loaders = [MixingLoader(pipe(base(), 2, r).options(world_size=2, global_rank=r, aggregate_dir=str(tmp_path),
                                                      run_id="run", aggregate_timeout_s=8),
                            Mixing(ScheduleController(schedule), interval_steps=1)) for r in range(2)]

    def steps(first, last):
        for step in range(first, last + 1):
            for ld in loaders:
                next(ld), next(ld)
                ld.record_loss(*loss_of(step))
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            for ld in loaders:
                ld.decide(step, figures)

    def checkpoint_all():
        out: list = [None, None]

        def run(r):
            try:
                out[r] = loaders[r].checkpoint()
            except AggregationError as e:
                out[r] = e

        threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out

    steps(1, 4)
    first = checkpoint_all()
    assert isinstance(first[0], dict) and first[0] == first[1]
    assert len(parse_definition(first[0]["definition"]).journal.decisions) == 1
    other = loaders[1].mixing.controller
    assert isinstance(other, ScheduleController)
    other.entries[1] = (6, dict(zip(NAMES, [1, 1, 5])))  # rank 1 now decides otherwise at step 6
    steps(5, 8)
    second = checkpoint_all()
    leader = str(second[0])
    assert isinstance(second[0], AggregationError) and "\n" not in leader
    assert re.search(r"global rank 1 [^:]*decided the steered mixture differently from global rank 0[^:]*: "
                     r"decision 1: step 6 -> chunk \d+: s0 0.7143, s1 0.1429, s2 0.1428 \(schedule\) vs step 6",
                     leader), leader
    for ld in loaders:
        ld.close()


def test_an_interval_in_tokens_counts_the_loss_tokens_since_the_last_decision():
    run = MixingLoader(pipe(base()), Mixing(IdentityController(), interval_tokens=70))
    due = []
    for step in range(1, 9):
        run.record_loss(*loss_of(step))  # 30 loss tokens a step
        due.append(run.due(step))
        if due[-1]:
            assert run.decide(step) is None  # identity without weights keeps the recipe's: nothing journaled
    assert due == [False, False, True, False, False, True, False, False]
    assert not run.journal.decisions
    with pytest.raises(ConfigError, match="record_loss: one figure per source"):
        run.record_loss([1.0], [1])
    run.close()


def test_a_recipe_mixing_table_is_checked_at_load_and_builds_the_mixing(tmp_path):
    from zephon_core.recipe import load_recipe

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    head = '[[sources]]\npath = "a.jsonl"\nname = "a"\n\n'
    (tmp_path / "mix.toml").write_text("[[decisions]]\nstep = 5\nweights = { a = 1 }\n")
    (tmp_path / "ok.toml").write_text(head + '[mixing]\ncontroller = "schedule"\nschedule = "mix.toml"\n'
                                      "interval_steps = 5\nmax_change = 0.2\n")
    mixing = load_recipe(tmp_path / "ok.toml").mixing()
    assert isinstance(mixing.controller, ScheduleController) and mixing.max_change == 0.2
    for body, needle in [('controller = "odm"\ninterval_steps = 5\nweights = { a = 1 }\n',
                          "mixing.weights is not a key of controller 'odm'"),
                         ('controller = "schedule"\nschedule = "none.toml"\ninterval_steps = 5\n', "none.toml"),
                         ('controller = "odm"\n', "give exactly one of interval_steps and interval_tokens")]:
        (tmp_path / "bad.toml").write_text(head + "[mixing]\n" + body)
        with pytest.raises(ConfigError, match=needle) as e:
            load_recipe(tmp_path / "bad.toml")
        assert str(e.value).startswith(str(tmp_path / "bad.toml")) and "\n" not in str(e.value)


def test_the_slots_summed_over_the_ranks_are_the_reduced_figures():
    """What the adapters' one all-reduce (SUM) computes from ``slots`` is ``LocalFigures.reduced`` of the ranks'."""
    parts = [LocalFigures(7, (5, 0, 2)), LocalFigures(9, (1, 4, 0)), LocalFigures(3, (0, 0, 6))]
    summed = [sum(col) for col in zip(*(p.slots(len(parts), r) for r, p in enumerate(parts)))]
    assert LocalFigures.from_slots(summed, 3) == LocalFigures.reduced(parts) == LocalFigures(9, (6, 4, 8))


def test_a_steered_state_restored_without_mixing_is_refused_not_unsteered():
    """A checkpoint taken just after a decision whose stage no lane has reached yet: a pipeline without mixing would
    accept it as 'a stage changed after its position' and silently train the recipe's own mixture from there on."""
    _, state, journal = steered_run(schedule_controller([(4, [1, 9, 1])]), [Phase(2, 4)])
    assert len(journal.decisions) == 1
    plain = pipe(base(), 2, 0)
    with pytest.raises(StateError, match=r"steered by a mixing journal \(1 decision, the last at step 4\).*mixing on"):
        plain.restore(state)
    MixingLoader(pipe(base(), 2, 0), Mixing(schedule_controller([(4, [1, 9, 1])])(), interval_steps=1)).restore(state)
