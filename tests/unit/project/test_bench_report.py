"""The bench's reports are generated, never hand-edited: bench/results/results.md and the block in
docs/performance.md are exactly what bench/report.py makes of the committed bench/results/results.json;
every goal module declares its targets and its section; every loader module implements the one protocol.

bench/ is a folder of scripts (its modules import each other by name, as ``python bench/run.py`` puts
bench/ first on sys.path), so the modules are imported here with bench/ prepended for this module only.
Nothing here runs a benchmark or needs the peers venv.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, ModuleType]]:
    """bench/'s report, goal registry and loaders, imported from bench/ (then forgotten, so that their plain
    names — report, harness, loaders — do not shadow anything in the rest of the session)."""
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        mods = {name: importlib.import_module(name) for name in ("report", "goals", "goal", "loaders", "cases")}
        mods["all_loaders"] = mods["loaders"].all_loaders()  # type: ignore[assignment]
        yield mods
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and str(BENCH) in str(sys.modules[name].__file__):
            del sys.modules[name]


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((RESULTS / "results.json").read_text())


def test_the_committed_results_json_renders_to_exactly_the_committed_results_md(bench, committed) -> None:
    rendered = bench["report"].markdown(committed)
    assert rendered == (RESULTS / "results.md").read_text(), (
        "bench/results/results.md is not what bench/results/results.json renders to: "
        "run `bash bench/run.sh --report-only`, never edit it by hand")


def test_the_docs_block_is_exactly_what_the_committed_results_json_renders_to(bench, committed) -> None:
    report = bench["report"]
    text = (ROOT / "docs" / "performance.md").read_text()
    block = report.current_headline(text)
    assert block, f"docs/performance.md has no {report.HEADLINE_START} ... {report.HEADLINE_END} block"
    assert text.count(report.HEADLINE_START) == 1 and text.count(report.HEADLINE_END) == 1
    assert block == report.headline(committed), (
        "docs/performance.md's results block is not what bench/results/results.json renders to: "
        "run `bash bench/run.sh --report-only`, never edit it by hand")
    # Every verdict of the run is a row of the block, with its figure and its verdict.
    verdicts = report.verdicts(committed)
    assert verdicts, "the committed run has no goal rows"
    for v in verdicts:
        assert f"| {v['goal']} | {v['target']} | {v['measured']} | {'PASS' if v['pass'] else 'FAIL'} |" in block


def test_a_changed_figure_changes_the_block(bench, committed) -> None:
    """The comparison above can fail: the block follows the numbers in results.json."""
    report = bench["report"]
    edited = json.loads(json.dumps(committed))
    edited["loadavg_end"] = [x + 1.0 for x in edited["loadavg_end"]]
    assert report.headline(edited) != report.headline(committed)
    text = "intro\n" + report.HEADLINE_START + "\nstale\n" + report.HEADLINE_END + "\nafter\n"
    assert report.replace_headline(text, report.headline(edited)).endswith("\nafter\n")
    assert "stale" not in report.replace_headline(text, report.headline(edited))


def test_every_goal_package_declares_its_targets_verdicts_and_section(bench, committed) -> None:
    goals, goal = bench["goals"], bench["goal"]
    modules = sorted(p.name for p in (BENCH / "goals").iterdir() if (p / "__init__.py").is_file())
    declared = [importlib.import_module(f"goals.{m}").GOAL for m in modules]
    assert all(any(g is r for r in goals.REGISTRY) for g in declared) and len(declared) == len(goals.REGISTRY), (
        "every package in bench/goals declares one goal (GOAL) of goals.REGISTRY")
    keys = [g.key for g in goals.REGISTRY]
    assert len(set(keys)) == len(keys)
    assert {"P1", "P2", "P3", "P4", "P4S", "P5", "P6", "P7", "P8", "P9", "P10"} <= set(keys)
    seen: set[str] = set()
    for g in goals.REGISTRY:
        assert isinstance(g, goal.Goal)
        assert isinstance(g.targets, dict) and all(isinstance(v, float) for v in g.targets.values())
        # Untargeted: the profiles and the studies (curriculum.py, packing.py, ledger.py) report what they measured.
        assert g.targets or g.key in ("profile", "curriculum", "packing", "ledger"), f"{g.key} declares no targets"
        assert not seen & set(g.targets), f"{g.key} repeats another goal's target"
        seen |= set(g.targets)
        assert all(k.startswith(g.key + "_") for k in g.targets), g.targets
        assert g.section({}, {}) == [] and g.verdicts({}) == [], f"{g.key} reports a goal it did not measure"
        for v in g.verdicts(committed):
            assert v["goal"].startswith(g.key + " ") and isinstance(v["pass"], bool), v
        assert g.run is not None or g.command, f"{g.key} neither measures nor names the command that does"
    # The targets moved into the goals unchanged: the committed run's table of targets is theirs.
    assert {k: v for k, v in committed["goals_targets"].items()} == {
        k: v for k, v in goals.targets().items() if k in committed["goals_targets"]}
    # Goals newer than the committed reference run (their targets are in the next one).
    newer = {"P10_tokens_vs_peer", "P11_lost_repeated", "P11_steps_differ", "P11_step_us", "P11_step_share",
             "P12_loss_share", "P4_8_ranks_s3_round_trips", "P4S_16k_many_lanes_local_s"}
    assert set(goals.targets()) - set(committed["goals_targets"]) <= newer


def test_every_case_is_defined_once_and_every_goal_section_renders_the_committed_run(bench, committed) -> None:
    cases = bench["cases"].all_cases()
    assert {"throughput", "digests", "prepare", "versions", "restore", "aggregate", "startup"} <= set(cases)
    for g in bench["goals"].REGISTRY:
        lines = g.section(committed, committed.get("baseline") or {})
        assert all(isinstance(line, str) for line in lines)
        if g.store in committed and g.verdicts(committed):
            assert lines and lines[0].startswith(f"## {g.key}"), (g.key, lines[:1])


def test_every_loader_module_implements_the_one_protocol(bench) -> None:
    loaders = bench["loaders"]
    files = sorted(p.stem for p in (BENCH / "loaders").glob("*.py") if p.stem not in ("__init__", "common"))
    assert sorted(loaders.MODULES) == files, "every module in bench/loaders is listed in loaders.MODULES"
    names = set()
    for module in loaders.MODULES:
        mod = importlib.import_module(f"loaders.{module}")
        assert mod.LOADERS and isinstance(mod.LOADERS, tuple), module
        for ld in mod.LOADERS:
            assert isinstance(ld, loaders.Loader), (module, ld)
            assert ld.venv in ("project", "peers"), ld
            assert ld.name not in names
            names.add(ld.name)
            assert len(inspect.signature(ld.make).parameters) == 1, ld.name
            assert len(inspect.signature(ld.tokens_of).parameters) == 1, ld.name
            assert len(inspect.signature(ld.close).parameters) == 2, ld.name
            if ld.resume is not None:
                assert isinstance(ld.resume, loaders.Resume)
    assert names == set(bench["all_loaders"])
    # The loaders the goals' tables name are the ones defined (P1's and P2's rows, P3's checkpointing ones).
    assert {"zephon_core", "zephon020", "torchdata", "grain", "generator", "tokenizer_alone", "numpy_copy",
            "zephon_core_npy", "zephon_core_megatron"} <= names
    assert all(bench["all_loaders"][n].resume is not None for n in ("zephon_core", "zephon020", "torchdata", "grain"))


def test_a_full_run_renders_beside_its_baseline_with_a_section_per_goal_it_measured(bench) -> None:
    """bench/results/baseline.json is a full run (P1-P6): rendered beside the baseline summary, as
    --report-only does, every measured goal has its section and "before" columns where the baseline kept a row."""
    report = bench["report"]
    R = json.loads((RESULTS / "baseline.json").read_text())
    R["baseline"] = report.baseline_summary(report.load_baseline(RESULTS / "baseline.json"))
    # A row the baseline summary does not keep (it keeps zephon_core's and the NumPy copy): "before" shows " - ".
    R["P2"]["NumPy shuffled-document copy"] = dict(R["P2"]["NumPy copy"])
    md = report.markdown(R)
    for key in ("P1", "P2", "P3", "P4", "P5"):
        assert f"\n## {key} " in md, key
    p2 = md[md.index("\n## P2 "):].split("\n\n")[1].splitlines()
    assert p2[0].startswith("| source |") and "before (7ae3dd9)" in p2[0]
    assert all(line.count("|") == p2[0].count("|") for line in p2), p2
    assert any(line.startswith("| NumPy shuffled-document copy |") and line.endswith(" - |") for line in p2)
    assert report.headline(R).startswith(report.HEADLINE_START) and "| PASS |" in report.headline(R)


def test_only_the_reference_run_writes_the_committed_results(bench) -> None:
    """A smoke run or a run of a few goals writes its own folder, so it never replaces the figures the docs show."""
    import argparse

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        run = importlib.import_module("run")
    every = set(run.DEFAULT_ONLY.split(","))
    assert {"P1", "P10"} <= every

    def folder(only: set[str], quick: bool = False):
        out = run.outputs(argparse.Namespace(quick=quick), only)
        return None if out is None else out.relative_to(RESULTS).as_posix()

    assert folder(every) is None and folder(every | {"P4S3"}) is None
    assert folder(every, quick=True) == "partial/" + "-".join(sorted(every)) + "-quick"
    assert folder({"P10"}) == "partial/P10"
    assert folder({"P3", "P1"}, quick=True) == "partial/P1-P3-quick"


def test_every_verdict_shows_the_target_it_was_checked_against(bench, committed) -> None:
    """A row's shown target is a number of the run's TARGETS, and its verdict is that bound applied to its value."""
    import re

    limits = set(committed["goals_targets"].values())
    checked = 0
    for v in bench["report"].verdicts(committed):
        m = re.fullmatch(r"(<=|>=) ([0-9.]+)(x| \w+)?", v["target"])
        assert m, f"{v['goal']}: target {v['target']!r} is not 'OP NUMBER[UNIT]'"
        limit = float(m.group(2))
        assert limit in limits, f"{v['goal']}: {limit} is none of the goals' targets {sorted(limits)}"
        if v["value"] is not None:
            assert v["pass"] == (v["value"] <= limit if m.group(1) == "<=" else v["value"] >= limit), v
            checked += 1
    assert checked >= 20, f"only {checked} rows carry a value"
