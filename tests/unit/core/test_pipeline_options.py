"""Pipeline identities, option validation, operator ordering and explain()."""

from __future__ import annotations

import re
import warnings

import pytest
from support.core_fixtures import CharTokenizer, mixture, text_docs, token_pipeline

from zephon_core import ConfigError, DataError, MemorySource, Pipeline, StaticMixture


@pytest.fixture
def ws():
    return mixture((50,), chunk_size=4)


def _no_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


# -- defaults -----------------------------------------------------------------
def test_defaults_single_process(ws):
    ident = Pipeline(ws).identity
    assert (ident.dp_degree, ident.dp_group_id, ident.world_size, ident.global_rank, ident.canonical_replicas) == (1, 0, 1, 0, 1)
    assert ident.lanes == [0]


def test_batches_are_packed_in_the_callers_thread_unless_prefetch_is_set(ws):
    import threading

    text = StaticMixture([MemorySource(text_docs(20))], chunk_size=4)
    cases = [
        (Pipeline(ws).pack(8).batch(2), 0),
        (Pipeline(text).tokenize(CharTokenizer()).pack(8).batch(2), 0),  # tokenizing is the reader thread's job
        (Pipeline(ws).pack(8).batch(2).options(prefetch=3), 3),
        (Pipeline(text).tokenize(CharTokenizer()).pack(8).batch(2).options(prefetch=2), 2),
    ]
    for p, want in cases:
        assert f"prefetch={want} batches" in p.explain()
        before = set(threading.enumerate())
        with p:
            next(iter(p))
            started = {t.name for t in set(threading.enumerate()) - before}
            assert ("zephon-prefetch" in started) == (want > 0)


def test_data_identity_defaults_to_coordination_identity(ws, tmp_path):
    p = Pipeline(ws).options(world_size=4, global_rank=3, aggregate_dir=str(tmp_path), run_id="r1")
    ident = p.identity
    assert (ident.dp_degree, ident.dp_group_id) == (4, 3)
    assert ident.canonical_replicas == 4  # C defaults to the initial dp_degree
    assert ident.lanes == [3]


def test_explicit_data_identity_and_canonical_replicas(ws):
    ident = Pipeline(ws).options(dp_degree=4, dp_group_id=1, canonical_replicas=8).identity
    assert (ident.dp_degree, ident.dp_group_id, ident.world_size, ident.global_rank) == (4, 1, 1, 0)
    assert ident.lanes == [2, 3]
    assert Pipeline(ws).options(dp_degree=3, dp_group_id=2).identity.canonical_replicas == 3


def test_builders_return_new_pipelines(ws):
    base = Pipeline(ws)
    with_opts = base.options(dp_degree=2, dp_group_id=1)
    assert base.identity.dp_degree == 1 and with_opts.identity.dp_degree == 2
    packed = base.pack(8)
    assert base.definition()["ops"] == [] and len(packed.definition()["ops"]) == 1
    # Later option calls keep earlier ones.
    both = with_opts.options(prefetch=5)
    assert both.identity.dp_group_id == 1


# -- validation ---------------------------------------------------------------
def test_unknown_option_suggests_the_right_name(ws):
    with pytest.raises(ConfigError) as e:
        Pipeline(ws).options(dp_degre=2)
    assert "'dp_degre'" in str(e.value) and "did you mean 'dp_degree'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Pipeline(ws).options(canonical_replica=8)
    assert "canonical_replicas" in str(e.value)
    with pytest.raises(ConfigError, match="unknown option 'zzz_qqq'"):
        Pipeline(ws).options(zzz_qqq=1)


def test_dp_degree_above_canonical_replicas(ws):
    with pytest.raises(ConfigError) as e:
        Pipeline(ws).options(dp_degree=8, dp_group_id=0, canonical_replicas=4)
    assert "dp_degree=8" in str(e.value) and "canonical_replicas=4" in str(e.value)
    with pytest.raises(ConfigError, match="exceeds"):  # the boundary
        Pipeline(ws).options(dp_degree=5, dp_group_id=4, canonical_replicas=4)
    assert Pipeline(ws).options(dp_degree=4, dp_group_id=3, canonical_replicas=4).identity.lanes == [3]


@pytest.mark.parametrize("gid", [2, 5, -1])
def test_dp_group_id_out_of_range(ws, gid):
    with pytest.raises(ConfigError, match="dp_group_id"):
        Pipeline(ws).options(dp_degree=2, dp_group_id=gid)


@pytest.mark.parametrize("rank", [4, 7, -1])
def test_global_rank_out_of_range(ws, tmp_path, rank):
    with pytest.raises(ConfigError, match="global_rank"):
        Pipeline(ws).options(world_size=4, global_rank=rank, aggregate_dir=str(tmp_path), run_id="r")


def test_world_size_above_one_needs_aggregate_dir_and_run_id(ws, tmp_path):
    with pytest.raises(ConfigError, match="aggregate_dir"):
        Pipeline(ws).options(world_size=2, global_rank=0, run_id="r")
    with pytest.raises(ConfigError, match="aggregate_dir"):
        Pipeline(ws).options(world_size=2, global_rank=0, aggregate_dir="", run_id="r")
    with pytest.raises(ConfigError, match="run_id"):
        Pipeline(ws).options(world_size=2, global_rank=0, aggregate_dir=str(tmp_path))
    Pipeline(ws).options(world_size=2, global_rank=1, aggregate_dir=str(tmp_path), run_id="pretrain-7b-2026-03-14")


@pytest.mark.parametrize("run_id", ["..", ".", "a/b", "../x", "a\\b", ".hidden", "x" * 129, "", "a b", "é", 5])
def test_bad_run_id(ws, tmp_path, run_id):
    with pytest.raises(ConfigError, match="run_id"):
        Pipeline(ws).options(world_size=2, global_rank=0, aggregate_dir=str(tmp_path), run_id=run_id)


@pytest.mark.parametrize("run_id", ["a", "x" * 128, "Run_1.v2-final"])
def test_good_run_id(ws, tmp_path, run_id):
    p = Pipeline(ws).options(world_size=2, global_rank=0, aggregate_dir=str(tmp_path), run_id=run_id)
    # Accepted as given, and named in the plan with the folder its rounds go to.
    assert f"aggregation:           {tmp_path} run_id={run_id} " in p.explain()


@pytest.mark.parametrize(
    "name, value",
    [
        ("world_size", 0),
        ("world_size", 1.0),
        ("dp_degree", 0),
        ("dp_degree", True),
        ("dp_group_id", "0"),
        ("canonical_replicas", -2),
        ("canonical_replicas", 2.0),
        ("prefetch", -1),
        ("readahead", -1),
        ("reader_threads", -1),
        ("pipelines_per_node", 0),
        ("aggregate_timeout_s", 0),
        ("aggregate_timeout_s", "3"),
    ],
)
def test_bad_option_values(ws, name, value):
    with pytest.raises(ConfigError, match=name):
        Pipeline(ws).options(**{name: value})


def test_canonical_replicas_zero_is_refused(ws):
    """0 lanes is impossible; it must not silently fall back to the default."""
    with pytest.raises(ConfigError, match="canonical_replicas"):
        Pipeline(ws).options(canonical_replicas=0)


def test_warns_when_lanes_do_not_divide_evenly(ws):
    with pytest.warns(RuntimeWarning, match=r"canonical_replicas=8 is not divisible by dp_degree=3"):
        Pipeline(ws).options(dp_degree=3, dp_group_id=0, canonical_replicas=8)
    _no_warnings(lambda: Pipeline(ws).options(dp_degree=4, dp_group_id=0, canonical_replicas=8))
    _no_warnings(lambda: Pipeline(ws).options(dp_degree=3, dp_group_id=2))


def test_uneven_lanes_warning_says_that_steps_change_after_a_resize(ws):
    with pytest.warns(RuntimeWarning, match=r"steps after a resize differ; use a dp_degree among \[1, 2, 3, 6\]"):
        Pipeline(ws).options(dp_degree=4, dp_group_id=0, canonical_replicas=6)


def test_restore_runs_the_checks_of_a_fresh_build_with_the_adopted_lanes(ws):
    """A C=8 state restored on dp_degree=3 with canonical_replicas unset adopts C=8: it warns as a build with C=8 would,
    and refuses a dp_degree above the state's lanes as a build would."""
    source = Pipeline(ws).pack(8).batch(2).options(canonical_replicas=8, prefetch=0)
    with source:
        next(iter(source))
        state = source.checkpoint()
    resumed = Pipeline(ws).pack(8).batch(2).options(dp_degree=3, dp_group_id=1, prefetch=0)  # no warning yet: C defaults to 3
    with pytest.warns(RuntimeWarning, match=r"canonical_replicas=8 is not divisible by dp_degree=3"):
        resumed.restore(state)
    _no_warnings(lambda: Pipeline(ws).pack(8).batch(2).options(dp_degree=4, dp_group_id=1, prefetch=0).restore(state))
    with pytest.raises(ConfigError, match="dp_degree=16 exceeds canonical_replicas=8"):
        Pipeline(ws).pack(8).batch(2).options(dp_degree=16, dp_group_id=1, prefetch=0).restore(state)


def test_work_source_type(ws):
    with pytest.raises(ConfigError, match="StaticMixture"):
        Pipeline([MemorySource(["a"])])


# -- operator chain -----------------------------------------------------------
def test_operator_ordering_errors(ws):
    p = Pipeline(ws)
    with pytest.raises(ConfigError, match="batch"):
        p.batch(2)  # no pack
    with pytest.raises(ConfigError, match="shuffle"):
        p.shuffle(4)  # before pack
    with pytest.raises(ConfigError, match="before pack"):
        p.pack(8).map(lambda d: d)
    with pytest.raises(ConfigError, match="before pack"):
        p.pack(8).filter(lambda d: True)
    with pytest.raises(ConfigError, match="before pack"):
        p.pack(8).tokenize(CharTokenizer())
    with pytest.raises(ConfigError, match="follow batch"):
        p.pack(8).batch(2).shuffle(4)
    with pytest.raises(ConfigError, match="follow batch"):
        p.pack(8).batch(2).map(lambda d: d)
    for twice in (lambda q: q.pack(8).pack(8), lambda q: q.pack(8).shuffle(2).shuffle(2), lambda q: q.pack(8).batch(2).batch(2)):
        with pytest.raises(ConfigError):
            twice(p)
    # Legal chains.
    p.map(lambda d: d).filter(lambda d: True).pack(8).shuffle(4).batch(2)
    p.pack(8).batch(2)


def test_iterating_without_pack_or_batch(ws):
    with pytest.raises(ConfigError, match="pack"):
        iter(Pipeline(ws).pack(4))


@pytest.mark.parametrize("seq_len", [0, -1, True, 2.0])
def test_pack_seq_len_must_be_positive(ws, seq_len):
    with pytest.raises(ConfigError, match="seq_len"):
        Pipeline(ws).pack(seq_len)


@pytest.mark.parametrize(
    "build, word",
    [
        (lambda p: p.pack(4, mode="bins"), "mode"),
        (lambda p: p.pack(4, pad_id=None), "pad_id"),
        (lambda p: p.pack(4).shuffle(0), "window"),
        (lambda p: p.pack(4).shuffle(4, seed="x"), "seed"),
        (lambda p: p.pack(4).batch(0), "batch_size"),
        (lambda p: p.map(len, parallelism=0), "parallelism"),
        (lambda p: p.map(len, runner="gpu"), "runner"),
    ],
)
def test_operator_argument_errors(ws, build, word):
    with pytest.raises(ConfigError, match=word):
        build(Pipeline(ws))


def test_text_reaching_pack_without_tokenize():
    ws = StaticMixture([MemorySource(text_docs(20), name="texts")], chunk_size=4)
    p = Pipeline(ws).pack(8).batch(1).options(prefetch=0)
    with pytest.raises(DataError) as e:
        next(iter(p))
    assert "tokenize" in str(e.value) and "'texts'" in str(e.value)
    # The same with the prefetch thread: the error reaches the consumer.
    p = Pipeline(ws).pack(8).batch(1).options(prefetch=2)
    with p, pytest.raises(DataError, match="tokenize"):
        next(iter(p))


def test_tokenize_on_tokens_is_an_error():
    p = token_pipeline().definition()  # sanity: builds
    assert p["ops"][0]["op"] == "pack"
    ws = mixture((20,), chunk_size=4)
    bad = Pipeline(ws).tokenize(CharTokenizer()).pack(8).batch(1).options(prefetch=0)
    with pytest.raises(DataError, match="tokenize"):
        next(iter(bad))


# -- explain ------------------------------------------------------------------
def _explain_pipeline(**options):
    ws = StaticMixture([MemorySource(text_docs(30), name="texts")], seed=4, chunk_size=4)
    return (
        Pipeline(ws)
        .tokenize(CharTokenizer(), eos_id=0, parallelism=3)
        .filter(len, parallelism=2, runner="process")
        .pack(16)
        .shuffle(8, seed=1)
        .batch(2)
        .options(**options)
    )


def test_explain_contents(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    p = _explain_pipeline(
        dp_degree=4, dp_group_id=1, canonical_replicas=8, world_size=8, global_rank=3,
        aggregate_dir=str(tmp_path), run_id="run-9", prefetch=4, reader_threads=2,
    )
    text = p.explain()
    assert "dp_group_id=1 of dp_degree=4" in text
    assert "global_rank=3 of world_size=8" in text
    assert "canonical_replicas=8, owned [2, 3]" in text
    assert "run_id=run-9" in text
    assert "texts" in text
    assert re.search(r"tokenize\(.*3 threads", text)
    assert re.search(r"filter\(fn=builtins.len; 2 process", text)
    assert "pack(seq_len=16" in text and "shuffle(window=8" in text and "batch(batch_size=2" in text
    assert "prefetch=4" in text
    # prefetch thread + 2 reader threads + 3 tokenize threads; 2 filter processes.
    assert "this pipeline starts:  6 thread(s), 2 process(es)" in text
    assert "per node (1 pipeline(s)): 6 thread(s), 2 process(es)" in text
    # Nothing was started by explaining.
    assert p._engine is None


def test_explain_spells_processes():
    text = _explain_pipeline().explain()
    assert "filter(fn=builtins.len; 2 processes)" in text
    assert "processs" not in text


def test_explain_per_node_total(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    p = _explain_pipeline(prefetch=0, reader_threads=1)
    # 1 reader + 3 tokenize threads, 2 processes; 8 pipelines on the node.
    assert "this pipeline starts:  4 thread(s), 2 process(es)" in p.explain()
    assert "per node (8 pipeline(s)): 32 thread(s), 16 process(es)" in p.explain()
    assert "per node (4 pipeline(s)): 16 thread(s), 8 process(es)" in p.explain(pipelines_per_node=4)
    opt = p.options(pipelines_per_node=2).explain()
    assert "per node (2 pipeline(s)): 8 thread(s), 4 process(es)" in opt


def test_explain_flags_uneven_lanes(ws):
    with pytest.warns(RuntimeWarning):
        p = token_pipeline(ws, dp_degree=3, dp_group_id=2, canonical_replicas=8)
    text = p.explain()
    assert "owned [6, 7]" in text and "uneven" in text
    assert "uneven" not in token_pipeline(ws, dp_degree=2, dp_group_id=0, canonical_replicas=8).explain()


# -- running --------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [0, 2])
def test_next_after_close_ends_instead_of_hanging(prefetch):
    import threading

    p = token_pipeline(prefetch=prefetch)
    it = iter(p)
    next(it)
    p.close()
    outcome = []

    def drain():
        try:
            for _ in range(20):
                next(it)
            outcome.append("no end")
        except BaseException as e:  # StopIteration or an error: either ends the loop
            outcome.append(e)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    t.join(3)
    assert not t.is_alive(), "next() on a closed pipeline blocks forever"
    assert outcome and outcome[0] != "no end"


def test_a_process_that_exits_without_close_exits_cleanly():
    """The prefetch thread may be inside the tokenizer (native code) at exit; it must be
    stopped before the interpreter finalizes, not killed mid-call (which aborts the process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    code = (
        "from tokenizers import Tokenizer\n"
        "from zephon_core import JsonlSource, Pipeline, StaticMixture\n"
        "work = StaticMixture([JsonlSource('configs/corpus/stdlib_docs.jsonl')], seed=1, chunk_size=16)\n"
        "tok = Tokenizer.from_file('configs/corpus/tokenizer.json')\n"
        "p = Pipeline(work).tokenize(tok, eos_id=1).pack(seq_len=128).shuffle(window=8).batch(2)\n"
        "p = p.options(canonical_replicas=8, dp_degree=4, dp_group_id=1, prefetch=2)\n"
        "next(iter(p))\n"  # exits while the prefetch thread tokenizes the next slices and chunks
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    for _ in range(10):  # the abort needed an unlucky moment: about every second run before the fix
        r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]


def test_the_plan_is_data_and_explain_renders_it(ws):
    from zephon_core.pipeline.plan import render

    p = Pipeline(ws).map(str.upper, parallelism=3).filter(bool, parallelism=2, runner="process").tokenize(CharTokenizer()).pack(8).batch(2)
    p = p.options(reader_threads=2, prefetch=1, pipelines_per_node=4)
    plan = p.plan()
    assert (plan.threads, plan.processes, plan.pipelines_per_node) == (1 + 2 + 3, 2, 4)
    assert [op.name for op in plan.operators] == ["map", "filter", "tokenize", "pack", "batch"]
    assert [op.how for op in plan.operators] == ["3 threads", "2 processes", "inline", "", ""]
    assert plan.identity == p.identity and plan.options.prefetch == 1
    assert p.explain() == render(plan)
    assert "per node (4 pipeline(s)): 24 thread(s), 8 process(es)" in p.explain()
