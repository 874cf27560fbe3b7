"""Checkpoint, restore, merge and elastic resumption."""

from __future__ import annotations

import copy
import json
import re
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core_fixtures import digests, json_roundtrip, mixture, take, token_pipeline

from zephon_core import ConfigError, MemorySource, Pipeline, StateError, StaticMixture, merge_states
from zephon_core.checkpoint.state import checksum_of, fingerprint_of
from zephon_core.verify.simulate import Phase, StepRecord, run_phase


def _resume(make, n_before, n_after, **restore_opts):
    """Run ``n_before`` batches, checkpoint, restore a fresh pipeline, run ``n_after``."""
    first = make()
    with first:
        before = take(first, n_before)
        state = json_roundtrip(first.checkpoint())
    second = make(**restore_opts)
    second.restore(state)
    with second:
        after = take(second, n_after)
    return before, after, state


VARIANTS = {
    "plain": dict(),
    "shuffle": dict(shuffle_window=5, shuffle_seed=2),
    "pad": dict(mode="pad", seq_len=20),
    "pad+shuffle": dict(mode="pad", seq_len=20, shuffle_window=3),
    "filter": dict(filter_fn=lambda d: len(d) % 3 != 0),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("prefetch", [0, 3])
@pytest.mark.parametrize("split", [1, 4, 7])
def test_restore_continues_byte_identically(variant, prefetch, split):
    kw = VARIANTS[variant]
    ws = mixture((300, 120), [3, 1], chunk_size=6)

    def make(**extra):
        return token_pipeline(ws, batch_size=2, prefetch=prefetch, **kw, **extra)

    with make() as ref_p:
        reference = digests(take(ref_p, 12))
    before, after, _ = _resume(make, split, 12 - split)
    assert digests(before) + digests(after) == reference


def test_restore_continues_per_group_with_several_lanes():
    ws = mixture((300,), chunk_size=5)

    def make(**extra):
        return token_pipeline(ws, shuffle_window=4, dp_degree=2, dp_group_id=1, canonical_replicas=6, prefetch=2, **extra)

    with make() as ref_p:
        reference = [(b.lane, b.lane_index, b.digest) for b in take(ref_p, 14)]
    before, after, state = _resume(make, 5, 9)
    assert sorted(state["lanes"]) == ["3", "4", "5"]
    assert [(b.lane, b.lane_index, b.digest) for b in before + after] == reference


def test_checkpoint_counts_only_delivered_batches():
    ws = mixture((300,), chunk_size=5)
    eager = token_pipeline(ws, canonical_replicas=2, dp_degree=1, dp_group_id=0, prefetch=8)
    lazy = token_pipeline(ws, canonical_replicas=2, dp_degree=1, dp_group_id=0, prefetch=0)
    with eager:
        take_eager = iter(eager)
        got = [next(take_eager) for _ in range(3)]
        deadline = time.monotonic() + 10
        while eager._engine._queue.qsize() < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eager._engine._queue.qsize() == 8, "the prefetch thread did not run ahead"
        state_eager = eager.checkpoint()
    take(lazy, 3)
    state_lazy = lazy.checkpoint()
    assert state_eager == state_lazy
    assert {k: v["delivered"] for k, v in state_eager["lanes"].items()} == {"0": 2, "1": 1}
    assert [b.lane for b in got] == [0, 1, 0]
    assert state_eager["lanes"]["0"]["cursor"] == list(got[2].cursor)
    assert state_eager["lanes"]["1"]["cursor"] == list(got[1].cursor)


def test_checkpoint_before_iterating_is_the_start():
    state = token_pipeline(dp_degree=2, dp_group_id=0, canonical_replicas=4).checkpoint()
    empty = {"since": 0, "rows": 0, "padding": 0, "cut": 0, "tokens": [], "documents": []}
    assert state["lanes"] == {"0": {"cursor": [0, 0, 0, 0], "delivered": 0, "tally": empty},
                              "1": {"cursor": [0, 0, 0, 0], "delivered": 0, "tally": empty}}
    assert state["canonical_replicas"] == 4
    assert state["topology"]["dp_degree"] == 2


def test_restore_after_iteration_raises():
    p = token_pipeline()
    take(p, 1)
    state = p.checkpoint()
    with pytest.raises(StateError, match="before"):
        p.restore(state)


def test_state_is_plain_json():
    p = token_pipeline(shuffle_window=3, dp_degree=2, dp_group_id=0, canonical_replicas=4)
    take(p, 3)
    state = p.checkpoint()
    text = json.dumps(state, allow_nan=False)
    assert json.loads(text) == state
    assert state["format"] == "zephon.state" and state["version"] == 2
    assert state["fingerprint"] == fingerprint_of(state["definition"])

    def plain(v):
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return v is None or type(v) in (str, int, float, bool)

    assert plain(state)


def test_restore_from_the_initial_state_equals_a_fresh_run():
    ws = mixture()
    state = token_pipeline(ws).checkpoint()
    p = token_pipeline(ws)
    p.restore(state)
    assert digests(take(p, 4)) == digests(take(token_pipeline(ws), 4))


def test_restore_is_a_seek():
    """A far-away cursor restores in constant time and reads the chunk it names."""
    ws = mixture((300,), chunk_size=5)
    p = token_pipeline(ws, canonical_replicas=2, dp_degree=1, dp_group_id=0)
    state = p.checkpoint()
    far = 10**12
    state["lanes"]["1"]["cursor"] = [far, 2, 0, 0]
    state["lanes"]["1"]["delivered"] = 7
    state["lanes"]["0"]["delivered"] = 7
    state["checksum"] = checksum_of(state)  # a deliberate edit, re-sealed
    q = token_pipeline(ws, canonical_replicas=2, dp_degree=1, dp_group_id=0)
    q.restore(state)
    t0 = time.monotonic()
    batches = take(q, 2)
    assert time.monotonic() - t0 < 5
    b = batches[1]
    assert (b.lane, b.lane_index) == (1, 7)
    chunk = ws.chunk(1 + far * 2)
    assert b.provenance[0][0].document == int(chunk.documents[2])


# -- refusals -----------------------------------------------------------------
def _state(**kw):
    p = token_pipeline(mixture(**kw.pop("mix", {})), **kw)
    take(p, 2)
    return json_roundtrip(p.checkpoint())


@pytest.mark.parametrize(
    "other, field",
    [
        (dict(mix=dict(seed=4)), "work_source.seed"),
        (dict(mix=dict(sizes=(400, 50), weights=[1, 2])), "work_source.sources"),
        (dict(seq_len=17), "ops[0].seq_len"),
        (dict(shuffle_window=4), "ops"),
        (dict(mix=dict(chunk_size=9)), "work_source.chunk_size"),
    ],
)
def test_refuses_a_state_of_different_data(other, field):
    state = _state()
    p = token_pipeline(mixture(**other.pop("mix", {})), **other)
    with pytest.raises(StateError) as e:
        p.restore(state)
    assert "different data" in str(e.value)
    assert field in str(e.value)


def test_refuses_different_weights_and_source_content():
    def ws(weights, docs):
        return StaticMixture([MemorySource(docs[0], name="a"), MemorySource(docs[1], name="b")], weights, chunk_size=4)

    docs = ([[1, 2, 3]] * 10, [[4, 5]] * 10)
    p = token_pipeline(ws([1, 1], docs))
    take(p, 1)
    state = p.checkpoint()
    with pytest.raises(StateError) as e:
        token_pipeline(ws([1, 3], docs)).restore(state)
    assert re.search(r"work_source\.sources\[1\]\.weight: 1(\.0)? vs 3(\.0)?", str(e.value)), str(e.value)
    changed = (docs[0], [[4, 5]] * 9 + [[4, 6]])
    with pytest.raises(StateError) as e:
        token_pipeline(ws([1, 1], changed)).restore(state)
    assert "work_source.sources[1].content_blake2b" in str(e.value)
    assert "sources[0]" not in str(e.value)


def test_refuses_a_different_canonical_replicas():
    state = _state(canonical_replicas=4, dp_degree=2, dp_group_id=0)
    with pytest.raises(StateError, match="canonical_replicas"):
        token_pipeline(canonical_replicas=8, dp_degree=2, dp_group_id=0).restore(state)


def test_default_canonical_replicas_is_taken_from_the_state():
    state = merge_states([_state(canonical_replicas=8, dp_degree=2, dp_group_id=g) for g in range(2)])
    p = token_pipeline(dp_degree=4, dp_group_id=3)  # C would default to 4
    p.restore(state)
    assert p.identity.canonical_replicas == 8
    assert p.identity.lanes == [6, 7]
    with pytest.raises(ConfigError, match="exceeds"):
        token_pipeline(dp_degree=16, dp_group_id=0).restore(state)


def test_refuses_a_state_without_this_groups_lanes():
    state = _state(canonical_replicas=4, dp_degree=2, dp_group_id=0)
    with pytest.raises(StateError) as e:
        token_pipeline(canonical_replicas=4, dp_degree=2, dp_group_id=1).restore(state)
    assert "[2, 3]" in str(e.value) and "merge" in str(e.value)
    # Lanes it does have are enough for a group that owns only those.
    token_pipeline(canonical_replicas=4, dp_degree=4, dp_group_id=1).restore(state)


def test_refuses_a_tampered_fingerprint_or_definition():
    state = _state()
    bad = copy.deepcopy(state)
    bad["fingerprint"] = "0" * 64
    with pytest.raises(StateError, match="fingerprint"):
        token_pipeline().restore(bad)
    bad = copy.deepcopy(state)
    bad["definition"]["work_source"]["seed"] = 99  # edited without updating the fingerprint
    with pytest.raises(StateError, match="fingerprint"):
        token_pipeline().restore(bad)


def _mutations():
    def drop(key):
        return lambda s: s.pop(key)

    def setter(path, value):
        def apply(s):
            target = s
            for k in path[:-1]:
                target = target[k]
            target[path[-1]] = value

        return apply

    return [
        ("missing format", drop("format"), "format"),
        ("missing lanes", drop("lanes"), "lanes"),
        ("missing definition", drop("definition"), "definition"),
        ("extra field", setter(["extra_thing"], 1), "extra_thing"),
        ("bad format", setter(["format"], "torch.pickle"), "format"),
        ("bad version", setter(["version"], 3), "version"),
        ("bool version", setter(["version"], True), "version"),
        ("version type", setter(["version"], "1"), "version"),
        ("C type", setter(["canonical_replicas"], "1"), "canonical_replicas"),
        ("C zero", setter(["canonical_replicas"], 0), "canonical_replicas"),
        ("topology type", setter(["topology"], []), "topology"),
        ("lanes type", setter(["lanes"], [1]), "lanes"),
        ("lane key", setter(["lanes", "x"], {"cursor": [0, 0, 0, 0], "delivered": 0}), "lanes['x']"),
        ("lane above C", setter(["lanes", "5"], {"cursor": [0, 0, 0, 0], "delivered": 0}), "lanes['5']"),
        ("lane fields", setter(["lanes", "0", "extra"], 1), "lanes['0']"),
        ("delivered type", setter(["lanes", "0", "delivered"], "2"), "lanes['0'].delivered"),
        ("delivered bool", setter(["lanes", "0", "delivered"], True), "lanes['0'].delivered"),
        ("delivered negative", setter(["lanes", "0", "delivered"], -1), "lanes['0'].delivered"),
        ("cursor length", setter(["lanes", "0", "cursor"], [0, 0, 0]), "lanes['0'].cursor"),
        ("cursor type", setter(["lanes", "0", "cursor"], "0,0,0,0"), "lanes['0'].cursor"),
        ("cursor element", setter(["lanes", "0", "cursor", 2], 1.5), "lanes['0'].cursor[2]"),
        ("cursor negative", setter(["lanes", "0", "cursor", 0], -3), "lanes['0'].cursor[0]"),
    ]


@pytest.mark.parametrize("name, mutate, field", _mutations(), ids=[m[0] for m in _mutations()])
def test_refuses_malformed_states_naming_the_field(name, mutate, field):
    state = _state()
    mutate(state)
    p = token_pipeline()
    with pytest.raises(StateError) as e:
        p.restore(state)
    assert field in str(e.value)
    assert p._restored_all is None  # nothing half-applied


def test_refuses_non_dict_state():
    with pytest.raises(StateError):
        token_pipeline().restore([1, 2])


# -- merging ------------------------------------------------------------------
def _group_states(G, C, steps, **kw):
    ws = kw.pop("ws", None) or mixture((400,), chunk_size=5)
    out = []
    for gid in range(G):
        p = token_pipeline(ws, dp_degree=G, dp_group_id=gid, canonical_replicas=C, **kw)
        take(p, steps)
        out.append(json_roundtrip(p.checkpoint()))
    return out


def test_merge_unions_lanes():
    states = _group_states(4, 8, 3)
    merged = merge_states(states)
    assert sorted(merged["lanes"], key=int) == [str(lane) for lane in range(8)]
    for part in states:
        for lane, value in part["lanes"].items():
            assert merged["lanes"][lane] == value
    assert merged["fingerprint"] == states[0]["fingerprint"]
    # Peers of the same group agree, so duplicates are fine.
    assert merge_states(states + states[:2]) == merged
    # Order does not matter.
    assert merge_states(states[::-1])["lanes"] == merged["lanes"]
    json.dumps(merged, allow_nan=False)


def test_merge_refuses_peers_at_different_steps():
    a = _group_states(2, 4, 3)
    b = _group_states(2, 4, 4)
    with pytest.raises(StateError) as e:
        merge_states([a[0], b[0]], labels=["rank 0", "rank 1"])
    assert "did not checkpoint at the same step" in str(e.value)
    assert "rank 0" in str(e.value) and "rank 1" in str(e.value)


def test_merge_refuses_different_runs():
    a = _group_states(2, 4, 1)
    with pytest.raises(StateError, match="canonical_replicas"):
        merge_states([a[0], _group_states(2, 8, 1)[1]])
    with pytest.raises(StateError, match="seed"):
        merge_states([a[0], _group_states(2, 4, 1, ws=mixture((400,), chunk_size=5, seed=77))[1]])
    with pytest.raises(StateError):
        merge_states([])


# -- elastic --------------------------------------------------------------------
def _per_lane_reference(ws, C, n_per_lane, **kw):
    p = token_pipeline(ws, dp_degree=1, dp_group_id=0, canonical_replicas=C, **kw)
    ref = {}
    for b in take(p, C * n_per_lane):
        ref[(b.lane, b.lane_index)] = b.digest
    return ref


@pytest.mark.parametrize("new_G", [1, 2, 8])
@pytest.mark.parametrize("shuffle_window", [None, 3])
def test_elastic_restore_of_merged_group_states(new_G, shuffle_window):
    C, G, steps = 8, 4, 3  # each group delivers 3 batches: 2 from its first lane, 1 from its second
    ws = mixture((600, 200), [1, 1], chunk_size=4)
    kw = dict(shuffle_window=shuffle_window, seq_len=12)
    ref = _per_lane_reference(ws, C, 6, **kw)
    states = []
    for gid in range(G):
        p = token_pipeline(ws, dp_degree=G, dp_group_id=gid, canonical_replicas=C, prefetch=2, **kw)
        with p:
            for b in take(p, steps):
                assert ref[(b.lane, b.lane_index)] == b.digest
            states.append(json_roundtrip(p.checkpoint()))
    merged = json_roundtrip(merge_states(states))
    delivered = {int(k): v["delivered"] for k, v in merged["lanes"].items()}
    assert delivered == {0: 2, 1: 1, 2: 2, 3: 1, 4: 2, 5: 1, 6: 2, 7: 1}
    seen = set()
    for gid in range(new_G):
        p = token_pipeline(ws, dp_degree=new_G, dp_group_id=gid, canonical_replicas=C, **kw)
        p.restore(merged)
        lanes = p.identity.lanes
        assert lanes == list(range(gid * C // new_G, (gid + 1) * C // new_G))
        n = 3 * len(lanes)
        got = take(p, n)
        for b in got:
            assert ref[(b.lane, b.lane_index)] == b.digest  # same batches as if never interrupted
            seen.add((b.lane, b.lane_index))
        # Each lane resumes at its own count, and lanes that are behind catch up first.
        first = {}
        for b in got:
            first.setdefault(b.lane, b.lane_index)
        assert first == {lane: delivered[lane] for lane in lanes}
        counts, expected = dict(delivered), []
        for _ in range(n):
            lane = min(lanes, key=lambda x: (counts[x], x))
            expected.append(lane)
            counts[lane] += 1
        assert [b.lane for b in got] == expected
    # Every lane continued exactly where it stopped, with no gap.
    for lane in range(C):
        idx = sorted(i for (l, i) in seen if l == lane)
        assert idx == list(range(delivered[lane], delivered[lane] + len(idx)))


def test_elastic_global_steps_match_across_topologies():
    """With a multiple of C batches per step, each step holds the same batches on any topology."""
    C = 4
    ws = mixture((500,), chunk_size=4)

    def run(phases):
        digests: list[str] = []
        _simulate(ws, C, phases, 2 * C, on_batch=lambda _, b: digests.append(b.digest), seq_len=10, shuffle_window=2)
        return [sorted(digests[i : i + 2 * C]) for i in range(0, len(digests), 2 * C)]

    reference = run([(4, 6)])
    assert run([(4, 2), (2, 2), (1, 1), (4, 1)]) == reference


def test_pipelines_checkpoint_together_through_aggregate_dir(tmp_path):
    """world_size=2: both ranks get the identical merged state."""
    ws = mixture((300,), chunk_size=5)
    results, errors = {}, []

    def rank(r):
        try:
            p = token_pipeline(
                ws, dp_degree=2, dp_group_id=r, world_size=2, global_rank=r, canonical_replicas=4,
                aggregate_dir=str(tmp_path), run_id="unit-run", aggregate_timeout_s=20,
            )
            take(p, 3)
            results[r] = p.checkpoint()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert results[0] == results[1]
    assert sorted(results[0]["lanes"]) == ["0", "1", "2", "3"]
    q = token_pipeline(ws, dp_degree=1, dp_group_id=0, canonical_replicas=4)
    q.restore(results[0])
    assert [b.lane for b in take(q, 4)] == [1, 3, 0, 1]


# -- finite curricula and the data contract ------------------------------------------
@pytest.mark.parametrize("shuffle_window", [None, 3])
@pytest.mark.parametrize("mode", ["concat", "pad"])
def test_restore_at_every_step_of_a_finite_curriculum(shuffle_window, mode):
    ws = mixture((16, 7), [2, 1], chunk_size=3, exhausted="stop")

    def make():
        return token_pipeline(ws, seq_len=9, batch_size=2, mode=mode, shuffle_window=shuffle_window, canonical_replicas=2, dp_degree=1, dp_group_id=0)

    reference = digests(make())
    assert len(reference) > 10
    for split in range(len(reference) + 1):
        first = make()
        head = take(first, split)
        state = json_roundtrip(first.checkpoint())
        second = make()
        second.restore(state)
        assert digests(head) + digests(second) == reference, f"split at {split}"


def _simulate(ws, C, phases, batches_per_step, on_batch=None, **kw) -> list[StepRecord]:
    """The simulation's records of ``phases`` of (dp_degree, steps), each merged state passed on through JSON."""

    def make(G: int, g: int) -> Pipeline:
        return token_pipeline(ws, dp_degree=G, dp_group_id=g, canonical_replicas=C, **kw)

    state, records = None, []
    for G, n_steps in phases:
        more, state = run_phase(make, Phase(G, n_steps), batches_per_step, state, on_batch=on_batch)
        records += more
        state = json_roundtrip(state)
    return records


def _run_steps(ws, C, phases, batches_per_step, **kw):
    """Per global step, the sorted row digests, running ``phases`` of (dp_degree, steps)."""
    return [r.digests for r in _simulate(ws, C, phases, batches_per_step, **kw)]


_DIVISORS = {1: [1], 2: [1, 2], 4: [1, 2, 4], 6: [1, 2, 3, 6], 8: [1, 2, 4, 8]}


@st.composite
def _scenarios(draw):
    C = draw(st.sampled_from(sorted(_DIVISORS)))
    n_sources = draw(st.integers(1, 2))
    sizes = tuple(draw(st.integers(5, 60)) for _ in range(n_sources))
    weights = [draw(st.floats(0.5, 2.0)) for _ in range(n_sources)]  # every source gets >= 1 per chunk
    chunk_size = draw(st.integers(2 * n_sources + 2, 8))
    phases = [(draw(st.sampled_from(_DIVISORS[C])), draw(st.integers(1, 2))) for _ in range(draw(st.integers(1, 3)))]
    kw = dict(
        seq_len=draw(st.integers(2, 12)),
        batch_size=draw(st.integers(1, 2)),
        mode=draw(st.sampled_from(["concat", "pad"])),
        shuffle_window=draw(st.sampled_from([None, 2, 4])),
    )
    seed = draw(st.integers(0, 2**31))
    return C, sizes, weights, chunk_size, seed, phases, draw(st.integers(1, 2)) * C, kw


@pytest.mark.topology
@settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(_scenarios())
def test_elastic_contract_property(scenario):
    """Any topology changes and checkpoint steps give, per global step, the rows of an uninterrupted run."""
    C, sizes, weights, chunk_size, seed, phases, per_step, kw = scenario
    ws = mixture(sizes, weights, seed=seed, chunk_size=chunk_size)
    total = sum(n for _, n in phases)
    reference = _run_steps(ws, C, [(1, total)], per_step, **kw)
    assert _run_steps(ws, C, phases, per_step, **kw) == reference


def test_execution_options_do_not_change_the_data_definition():
    ws = StaticMixture([MemorySource([f"text {i}" for i in range(40)], name="t")], chunk_size=4)
    from support.core_fixtures import CharTokenizer

    def build(par, runner, **opts):
        return Pipeline(ws).tokenize(CharTokenizer(), parallelism=par, runner=runner).pack(8).batch(2).options(**opts)

    a = build(1, "thread", prefetch=0)
    take(a, 3)
    state = a.checkpoint()
    b = build(3, "thread", prefetch=5, readahead=3, reader_threads=2)
    b.restore(state)  # accepted: only the data defines the fingerprint
    c = build(1, "thread", prefetch=0)
    c.restore(state)
    with b:
        assert digests(take(b, 3)) == digests(take(c, 3))


def test_restore_then_checkpoint_returns_the_restored_progress():
    states = _group_states(2, 4, 3)
    merged = merge_states(states)
    p = token_pipeline(mixture((400,), chunk_size=5), dp_degree=1, dp_group_id=0, canonical_replicas=4)
    p.restore(merged)
    assert p.checkpoint()["lanes"] == merged["lanes"]
