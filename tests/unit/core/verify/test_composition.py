"""Every feature together (issue #40): a run history of random operations is the uninterrupted run, and every
reader follows it.

A drawn run goes through segments on random data-parallel degrees, each resumed from the last one's merged state;
between segments it may roll back (a detour whose steps are abandoned, as after a loss spike), skip later steps and
quarantine documents (``zephon skip`` / ``zephon quarantine`` on the JSON state), append a stage with a new source,
or run a stretch live (``zephon_core.live.simulate``: replica groups leaving and joining). A steered draw is steered
by a user-written controller whose asks often change nothing (so only the steering clock knows of them).

The reference is the run that never stopped: one group from step 1, the same operations at the same steps (the
skips journaled before it starts, each quarantine from where the reference itself stood at that step). Every
trained step of the drawn run must equal the reference's, and the readers must agree with what was trained: the
ledger by replay and from the audit logs (appended launch after launch, the detours' lines among them), and the
recipe with the final state's history replayed on other degrees (what ``trace`` and ``verify-elastic`` run).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, Stage, StagedMixture
from zephon_core.checkpoint.merge import merge_states
from zephon_core.checkpoint.state import skip_in_state
from zephon_core.checkpoint.surgery import SurgeryJournal, surgery_journal_of
from zephon_core.integration.batch_log import LogIdentity, log_line, run_fingerprint
from zephon_core.live.simulate import Fault, simulate
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader, with_history
from zephon_core.pipeline.surgery import quarantined_state
from zephon_core.verify.ledger import COLUMNS, build_ledger
from zephon_core.verify.ledger_logs import ledger_from_logs
from zephon_core.verify.log_timelines import read_run_logs
from zephon_core.verify.simulate import Phase, run_phase

C = 4
Sample = tuple[int, int, str]


def _source(name: str, seed: int, n: int) -> MemorySource:
    rng = np.random.default_rng(seed)
    return MemorySource([[seed * 100 + d % 50] * int(rng.integers(2, 14)) for d in range(n)], name=name)


SOURCES = {"a": _source("a", 1, 90), "b": _source("b", 2, 70), "c": _source("c", 3, 60)}


class Leaning:
    """A user's own controller: of every three asks, one keeps the weights, one changes nothing (None) and one
    leans towards the sources whose smoothed loss is highest. Its memory is JSON, so a resume continues it."""

    name = "leaning"

    def __init__(self) -> None:
        self.asks, self.seen = 0, [0.0, 0.0]

    def params(self) -> dict[str, Any]:
        return {}

    def propose(self, inputs: Any) -> Sequence[float] | None:
        self.asks += 1
        self.seen = [0.5 * s + (m or 0.0) for s, m in zip(self.seen, inputs.mean_loss())]
        if self.asks % 3 == 1:
            return list(inputs.weights)
        return None if self.asks % 3 == 0 else [1 + s for s in self.seen]

    def state(self) -> dict[str, Any]:
        return {"asks": self.asks, "seen": list(self.seen)}

    def load_state(self, state: Any) -> None:
        self.asks, self.seen = int(state["asks"]), [float(x) for x in state["seen"]]


@dataclass(frozen=True)
class Draw:
    steered: bool
    per_lane: int
    chunk: int
    segments: list[tuple[str, int, int]]  # (kind: run/detour/live, dp degree or live replicas, steps)
    ops: list[dict[str, Any]]  # after each segment: skip (offset, length), quarantine (doc), append (chunks ahead)


class Run:
    """The recipe of a draw, its pipelines, and the steering the adapters would do."""

    def __init__(self, draw: Draw, appended_at: int | None = None) -> None:
        self.draw, self.B = draw, C * draw.per_lane
        self.appended_at = appended_at  # the global chunk the appended stage starts at (None: not appended)
        self.decided: list[Any] = []
        self.tokens: dict[int, list[int]] = defaultdict(lambda: [0, 0])

    def mixture(self) -> StagedMixture:
        stages = [Stage({"a": 2, "b": 1}, name="main")]
        if self.appended_at is not None:
            stages.append(Stage({"b": 1, "c": 2}, name="anneal", start_chunk=self.appended_at))
        names = {n for s in stages for n in s.weights}
        return StagedMixture([s for n, s in SOURCES.items() if n in names], stages, seed=7, chunk_size=self.draw.chunk)

    def plain(self, G: int, gid: int) -> Pipeline:
        return (Pipeline(self.mixture()).pack(8).shuffle(3, seed=1).batch(2)
                .options(canonical_replicas=C, dp_degree=G, dp_group_id=gid, prefetch=0))

    def make(self, G: int, gid: int) -> Any:
        p = self.plain(G, gid)
        if not self.draw.steered:
            return p
        return MixingLoader(p, Mixing(Leaning(), interval_steps=2, min_share=0.1, max_change=0.3))

    def on_batch(self, gid: int, b: Any) -> None:
        for _, source, _, x, y in b.segments.tolist():
            if source < 2:
                self.tokens[b.lane_index // self.draw.per_lane + 1][source] += y - x

    def after(self, loaders: list[Any]) -> None:
        if not self.draw.steered:
            return
        step = loaders[0].pipeline.local_state()["lanes"]
        step = max(v["delivered"] for v in step.values()) // self.draw.per_lane
        tokens = self.tokens.pop(step, [0, 0])
        for ld in loaders:
            ld.record_loss([n * (2.0 + (step % 4) / 4 + k) for k, n in enumerate(tokens)], tokens)
        if loaders[0].due(step):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            made = [ld.decide(step, figures) for ld in loaders]
            assert all(d == made[0] for d in made)
            self.decided.append(made[0])


def _trained(samples: dict[int, list[Sample]], gid_batches: list[tuple[int, Any]], per_lane: int) -> None:
    for _, b in gid_batches:
        samples[b.lane_index // per_lane + 1].append((b.lane, b.lane_index, b.digest))


def _step_of(state: dict[str, Any], per_lane: int) -> int:
    return max(v["delivered"] for v in state["lanes"].values()) // per_lane


def _history_pipeline(run: Run, state: dict[str, Any], G: int, gid: int) -> Pipeline:
    """The recipe's pipeline with the state's history applied (the readers' one door)."""
    return with_history(run.plain(G, gid), state)


def run_drawn(draw: Draw, tmp_path: Any) -> tuple[Run, dict[int, list[Sample]], dict[str, Any], list[str], list[Any]]:
    """The drawn run: what each kept global step trained on, the final state, the audit log files, the operations
    as the reference replays them."""
    run = Run(draw)
    samples: dict[int, list[Sample]] = defaultdict(list)
    state: dict[str, Any] | None = None
    files: dict[str, list[str]] = defaultdict(list)
    timeline: list[Any] = []  # ("skip", a, b) / ("quarantine", step, docs) / ("append", chunk)
    for n, ((kind, width, steps), op) in enumerate(zip(draw.segments, draw.ops)):
        launch = f"20261205T{n:06d}Z-1"
        at = 0 if state is None else _step_of(state, draw.per_lane)
        if kind == "live" and state is not None and any(s.last > at for s in surgery_journal_of(state).skips):
            kind = "run"  # live mode refuses a skip still ahead of its lanes (zephon_core.live.plan)
        if kind == "live":
            def restored(slots: int, slot: int, st: Any = state) -> Pipeline:
                p = run.plain(slots, slot)
                if st is not None:
                    p.restore(st)
                return p
            faults = [Fault(at + 1 + steps // 2, "die_after_exchange", 1), Fault(at + steps - 1, "join")]
            live = simulate(restored, slots=2, batches_per_lane=draw.per_lane, replicas=width, steps=steps,
                            faults=faults)
            for s, got in live.steps.items():
                samples[s + 1].extend(got)
            state = json.loads(json.dumps(merge_states(live.final)))
        else:
            batches: list[tuple[int, Any]] = []
            saved = run.decided[:]
            _, merged = run_phase(run.make, Phase(width, steps), run.B, state, after_step=run.after,
                                  on_batch=lambda gid, b: (batches.append((gid, b)), run.on_batch(gid, b)))
            for gid, b in batches:
                ident = LogIdentity(run_fingerprint(run.plain(1, 0).definition()), launch)
                files[f"batches-{gid}.log"].append(log_line(b, ident))
            if kind == "detour":  # rolled back: its steps never happened, the state before it is resumed
                run.decided = saved
                run.tokens.clear()
            else:
                _trained(samples, batches, draw.per_lane)
                state = json.loads(json.dumps(merged))
        assert state is not None
        at = _step_of(state, draw.per_lane)
        first = at + 1 + op.get("skip", (0, 0))[0]
        last = first + op.get("skip", (0, 0))[1]
        if "skip" in op and not any(s.first <= last and first <= s.last for s in surgery_journal_of(state).skips):
            state = skip_in_state(state, first, last, run.B)  # an overlapping one is refused (test_skip_rule)
            timeline.append(("skip", first, last))
        if "quarantine" in op:
            docs = [("a", op["quarantine"])]
            state = json.loads(json.dumps(quarantined_state(_history_pipeline(run, state, 1, 0), state, docs)))
            timeline.append(("quarantine", at, docs))
        if "append" in op and run.appended_at is None:
            frontier = _history_pipeline(run, state, 1, 0)
            frontier.restore(state)
            run.appended_at = frontier.read_frontier() + op["append"]
            timeline.append(("append", run.appended_at))
    paths = []
    for name, lines in files.items():
        (tmp_path / name).write_text("".join(lines))
        paths.append(str(tmp_path / name))
    return run, samples, state, paths, timeline


def reference(draw: Draw, timeline: list[Any], steps: int) -> tuple[dict[int, list[Sample]], list[Any]]:
    """The uninterrupted run on one group with the same operations at the same steps."""
    appended = next((t[1] for t in timeline if t[0] == "append"), None)
    skips = SurgeryJournal()
    for t in timeline:
        if t[0] == "skip":
            skips = skips.with_skip(_skip(t[1], t[2], draw))
    quarantines: list[Any] = []
    for t in [t for t in timeline if t[0] == "quarantine"] + [None]:
        run = Run(draw, appended)
        samples: dict[int, list[Sample]] = defaultdict(list)
        p = run.make(1, 0)
        inner = p.pipeline if draw.steered else p
        inner.surgery = SurgeryJournal(skips.skips, tuple(quarantines))
        upto = steps if t is None else _trained_before(t[1], skips)
        batches: list[tuple[int, Any]] = []
        _steps(run, p, upto, batches)
        _trained(samples, batches, draw.per_lane)
        if t is not None:  # the reference's own lanes at that step say where the quarantine starts
            now = p.pipeline if draw.steered else p
            probe = now.with_work_source(now.work_source)
            probe.restore(now.local_state())
            probe.quarantine(t[2])
            quarantines.append(probe.surgery.quarantines[-1])
        p.close()
    return samples, run.decided


def _skip(first: int, last: int, draw: Draw) -> Any:
    from zephon_core.checkpoint.surgery import skip_of

    return skip_of(first, last, C * draw.per_lane, C)


def _trained_before(step: int, skips: SurgeryJournal) -> int:
    """How many steps train up to global step ``step`` (the skipped ones do not)."""
    return sum(1 for s in range(1, step + 1) if skips.skip_at(s) is None)


def _steps(run: Run, p: Any, steps: int, batches: list[tuple[int, Any]]) -> None:
    it = iter(p)
    for _ in range(steps):
        for _ in range(run.B):
            b = next(it)
            batches.append((0, b))
            run.on_batch(0, b)
        run.after([p])


segments = st.lists(st.tuples(st.sampled_from(["run", "detour", "live"]), st.sampled_from([1, 2, 4]),
                              st.integers(2, 4)), min_size=2, max_size=4)
ops = st.fixed_dictionaries({}, optional={"skip": st.tuples(st.integers(0, 1), st.integers(0, 1)),
                                          "quarantine": st.integers(0, 60), "append": st.integers(1, 6)})


@st.composite
def draws(draw_: Any) -> Draw:
    steered = draw_(st.booleans())
    segs = draw_(segments)
    # Live mode refuses steering, and a skip still ahead of its lanes: a drawn live segment runs only where
    # nothing is steered and no skip lies ahead.
    segs = [("run", w, s) if k == "live" and steered else (k, max(w, 2) if k == "live" else w, s) for k, w, s in segs]
    segs[0] = ("run", segs[0][1], segs[0][2])  # a rollback needs a checkpoint to roll back to
    segs[-1] = ("run", segs[-1][1], segs[-1][2])  # the run ends on a kept segment
    chosen = [draw_(ops) for _ in segs]
    for n, (kind, _, _) in enumerate(segs):
        if kind == "live" and n and "skip" in chosen[n - 1]:
            chosen[n - 1] = {k: v for k, v in chosen[n - 1].items() if k != "skip"}
        if steered:
            chosen[n] = {k: v for k, v in chosen[n].items() if k != "append"}  # decisions follow the recipe's stages
    return Draw(steered, draw_(st.sampled_from([1, 2])), draw_(st.sampled_from([4, 6])), segs, chosen)


@pytest.mark.topology
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(draws())
def test_every_operation_together_is_the_uninterrupted_run_and_every_reader_agrees(tmp_path_factory, draw):
    tmp = tmp_path_factory.mktemp("logs")
    run, samples, state, paths, timeline = run_drawn(draw, tmp)
    trained = len(samples)
    ref, ref_decided = reference(draw, timeline, trained)
    assert sorted(samples) == sorted(ref)
    for step in ref:
        assert sorted(samples[step]) == sorted(ref[step]), f"global step {step}"
    if draw.steered:
        assert run.decided == ref_decided  # every ask, those that changed nothing included
    delivered = {(lane, index): digest for got in samples.values() for lane, index, digest in got}
    # the ledger by replay, and from the logs (appended launch after launch, detours among them)
    replayed = build_ledger(lambda: run.plain(1, 0), state, run.B)
    assert replayed.digests == delivered
    if not any(k == "live" for k, _, _ in draw.segments):  # live stretches write no audit lines here
        logs = read_run_logs(paths, run_fingerprint(state["definition"]))
        from_logs = ledger_from_logs(logs.logged, state, run.B, run.mixture().sources)
        assert from_logs.digests == delivered
        table = [np.stack([x.columns[k] for k in COLUMNS], axis=1).tolist() for x in (from_logs, replayed)]
        assert table[0] == table[1]
    # the recipe with the final state's history, on other degrees: what trace and verify-elastic run
    steps_with_skips = max(samples)
    for G in (1, 4):
        records: dict[int, list[Sample]] = defaultdict(list)
        run_phase(lambda g, i: _history_pipeline(run, state, g, i), Phase(G, trained), run.B, None,
                  on_batch=lambda _g, b: records[b.lane_index // draw.per_lane + 1].append(
                      (b.lane, b.lane_index, b.digest)))
        assert max(records) == steps_with_skips
        assert {s: sorted(v) for s, v in records.items()} == {s: sorted(v) for s, v in samples.items()}


def test_the_readers_refuse_what_is_not_this_runs_history(tmp_path):
    """The same drawn run's readers, given another run's logs, a torn log or a hand-edited state: each refuses in
    one line naming the file (issue #40 items 3, 5 and 8), where before each answered from it with exit 0."""
    from zephon_core.errors import DataError, StateError
    from zephon_core.integration.state_readers import load_checked_state

    def drawn(chunk: int, where: Any) -> tuple[dict[str, Any], list[str]]:
        draw = Draw(True, 1, chunk, [("run", 2, 3), ("detour", 4, 2), ("run", 1, 3)],
                    [{}, {"skip": (0, 0), "quarantine": 3}, {}])
        where.mkdir()
        _, _, state, paths, _ = run_drawn(draw, where)
        return state, paths

    state, paths = drawn(4, tmp_path / "ours")
    _, theirs = drawn(6, tmp_path / "theirs")
    run = run_fingerprint(state["definition"])
    assert read_run_logs(paths, run).logged  # ours read as one timeline, the detour's lines among them
    with pytest.raises(DataError, match=f"{theirs[0]} line 1: a line of run .*, not of the state's run"):
        read_run_logs(theirs, run)
    torn = tmp_path / "torn.log"
    text = open(paths[0]).read()
    torn.write_text(text[: text.rindex(",", 0, len(text) - 1)])  # the last line cut inside its rows
    with pytest.raises(DataError, match=f"{torn} line {text.count(chr(10))}"):
        read_run_logs([str(torn)], run)
    lines = text.splitlines(keepends=True)  # a whole line whose last row stretch is gone (and its crc with it)
    last = lines[-1].split(" ")
    lines[-1] = " ".join([*last[:6], last[6].rsplit("/", 1)[0] if "/" in last[6] else last[6].rsplit(",", 1)[0],
                          *last[7:]])
    torn.write_text("".join(lines))
    with pytest.raises(DataError, match=f"{torn} line {len(lines)}"):
        read_run_logs([str(torn)], run)
    edited = json.loads(json.dumps(state))
    edited["lanes"]["0"]["delivered"] += 1
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(StateError, match="edited.json: state field checksum does not match"):
        load_checked_state(str(tmp_path / "edited.json"))
    with pytest.raises(StateError, match="checksum"):
        build_ledger(lambda: Run(Draw(True, 1, 4, [], [])).plain(1, 0), edited, C)
