"""The ``zephon`` command line, run as a user would (a subprocess per call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import zephon

ROOT = Path(__file__).resolve().parents[4]
DEMO = ROOT / "configs" / "data" / "demo.toml"


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Two merged states of the demo recipe: after 1 and after 2 global steps (the simulation on 2 groups)."""
    from zephon_core.recipe import load_recipe
    from zephon_core.verify.simulate import Phase, run_phase

    recipe = load_recipe(DEMO)
    out = tmp_path_factory.mktemp("states")
    def make(G: int, g: int):
        return recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)

    paths = []
    state = None
    for step in (1, 2):
        _, state = run_phase(make, Phase(2, 1), 8, state)
        path = out / f"step{step}.json"
        path.write_text(json.dumps(state))
        paths.append(path)
    return paths


@pytest.mark.parametrize("command", ["explain", "inspect", "diff", "verify-elastic", "trace", "report"])
def test_every_command_has_help(command):
    r = zephon(command, "--help")
    assert r.returncode == 0 and "usage: zephon " + command in r.stdout


def test_usage_error_exits_2():
    r = zephon("verify-elastic", str(DEMO))
    assert r.returncode == 2 and "required" in r.stderr
    assert zephon("no-such-command").returncode == 2


def test_explain_prints_the_plan_without_data(tmp_path):
    r = zephon("explain", str(DEMO), "--dp-degree", "4", "--world-size", "8", "--per-node", "8")
    assert r.returncode == 0, r.stderr
    assert "dp_group_id=0 of dp_degree=4" in r.stdout and "owned [0, 1]" in r.stdout
    assert "per node (8 pipeline(s)): 8 thread(s)" in r.stdout  # one reader thread each; batches packed by the caller


def test_inspect_shows_positions(states):
    r = zephon("inspect", str(states[1]))
    assert r.returncode == 0, r.stderr
    assert "canonical_replicas: 8" in r.stdout
    lanes = [line.split() for line in r.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert len(lanes) == 8 and all(row[-1] == "2" for row in lanes), lanes  # 2 batches delivered per lane
    # A JSONL source's fingerprint knows its bytes, not its documents: named as such.
    size = (ROOT / "configs" / "corpus" / "stdlib_docs.jsonl").stat().st_size
    assert f" bytes={size}" in r.stdout and f"size={size}" not in r.stdout, r.stdout


def test_inspect_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "zephon.state"')
    r = zephon("inspect", str(bad))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "not a JSON checkpoint state" in r.stderr
    bad.write_text(json.dumps({"format": "zephon.state"}))
    r = zephon("inspect", str(bad))
    assert r.returncode == 1 and "missing field" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_diff_of_checkpoints_and_recipes(states, tmp_path):
    same = zephon("diff", str(states[0]), str(states[0]))
    assert same.returncode == 0 and same.stdout.strip() == "identical"
    r = zephon("diff", str(states[0]), str(states[1]))
    assert r.returncode == 1 and r.stdout.count("lanes[") == 8
    other = tmp_path / "other.toml"
    other.write_text(DEMO.read_text().replace("seed = 20261129", "seed = 5").replace('"../corpus/', f'"{ROOT}/configs/corpus/'))
    r = zephon("diff", str(DEMO), str(other))
    assert r.returncode == 1 and "seed: 20261129 vs 5" in r.stdout


def test_verify_elastic_passes_and_fails_with_the_first_step():
    ok = zephon("verify-elastic", str(DEMO), "--canonical-replicas", "8", "--from", "8", "--to", "2",
                "--checkpoint-step", "2", "--steps", "4", "--batches-per-step", "8", "--progress")
    assert ok.returncode == 0 and ok.stdout.startswith("ok: 4 global steps identical"), ok.stdout + ok.stderr
    assert "4/4 reference" in ok.stderr or "8/8" in ok.stderr  # the progress bar
    bad = zephon("verify-elastic", str(DEMO), "--canonical-replicas", "8", "--from", "4", "--to", "2",
                 "--checkpoint-step", "2", "--steps", "4", "--batches-per-step", "4")
    assert bad.returncode == 1 and "MISMATCH at global step 3" in bad.stdout


def test_trace_lists_documents_of_a_step():
    r = zephon("trace", str(DEMO), "--step", "2", "--batches-per-step", "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("global step 2: 8 batches")
    rows = [line for line in r.stdout.splitlines() if line.strip().startswith("row ")]
    assert len(rows) == 16 and all("stdlib_docs.jsonl#" in row for row in rows)


def test_trace_rejects_a_step_size_that_is_not_topology_free():
    r = zephon("trace", str(DEMO), "--step", "1", "--batches-per-step", "4")
    assert r.returncode == 1 and "multiple of canonical_replicas 8" in r.stderr


def test_framework_checkpoints_are_read_by_registered_readers_not_by_importing_adapters(tmp_path):
    from zephon_core.integration.state_readers import StateReader, StateReadError, load_state, registered

    # The adapters register theirs as entry points of the installed distribution.
    assert {"torchtitan", "megatron"} <= {r.name for r in registered()}
    folder = tmp_path / "step-4"
    folder.mkdir()
    seen = []
    reader = StateReader("fake", "a fake checkpoint folder", claims=lambda p: p.endswith("step-4"), read=lambda p: seen.append(p) or {"a": 1})
    assert load_state(str(folder), [reader]) == {"a": 1} and seen == [str(folder)]
    with pytest.raises(StateReadError, match="no installed adapter reads it"):
        load_state(str(folder), [])
    r = zephon("inspect", str(folder))  # the TorchTitan reader claims folders; this one is not a DCP checkpoint
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "not a DCP checkpoint folder" in r.stderr, r.stderr


# -- training recipes, the run's shape, one-line errors (issue 14) -----------------------------
TRAINING = [("tt_train", "torchtitan"), ("tt_heldout", "torchtitan"), ("mg_train", "megatron"), ("mg_heldout", "megatron")]


@pytest.mark.parametrize("name,framework", TRAINING)
def test_every_bundled_training_recipe_works_with_explain_trace_and_verify_elastic(name, framework):
    recipe = str(ROOT / "configs" / "data" / f"{name}.toml")
    shape = ["--framework", framework, "--tokenizer", str(ROOT / "configs" / "corpus"), "--seq-len", "64", "--batch-size", "2"]
    assert zephon("explain", recipe, *shape).returncode == 0
    r = zephon("trace", recipe, "--step", "1", "--canonical-replicas", "2", *shape)
    assert r.returncode == 0 and "row 0:" in r.stdout, r.stderr
    r = zephon("verify-elastic", recipe, "--canonical-replicas", "4", "--from", "4", "--to", "2", "--checkpoint-step", "1", "--steps", "2", *shape)
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stdout + r.stderr


def test_training_recipe_tokenization_follows_the_framework():
    """TorchTitan's adapter puts BOS and EOS around each document, Megatron's EOD only: the traces differ."""
    recipe = str(ROOT / "configs" / "data" / "tt_train.toml")
    shape = ["--tokenizer", str(ROOT / "configs" / "corpus"), "--seq-len", "64", "--batch-size", "2", "--step", "1"]
    tt, mg = (zephon("trace", recipe, "--framework", f, *shape).stdout for f in ("torchtitan", "megatron"))
    assert tt and mg and tt != mg


@pytest.mark.parametrize("args,says", [
    (["explain", "configs/data/tt_train.toml"], "is a training recipe (no [standalone]): pass --framework"),
    (["explain", "configs/data/mg_train.toml", "--framework", "megatron"], "pass --tokenizer (the run's --tokenizer-model"),
    (["explain", "configs/data/mg_train.toml", "--framework", "megatron", "--tokenizer", "configs/corpus"], "pass --seq-len (the run's --seq-length)"),
    (["trace", "configs/data/tt_train.toml", "--step", "1", "--framework", "torchtitan", "--tokenizer", "no/such/dir"], "--tokenizer: no/such/dir: no such file"),
    (["explain", "configs/data/tt_train.toml", "--framework", "torchtitan", "--tokenizer", "configs/data"], "is a folder without a tokenizer.json"),
    (["explain", "configs/data/tt_train.toml", "--framework", "torchtitan", "--tokenizer", "configs/corpus/tokenizer_config.json"], "not a tokenizers tokenizer.json"),
    (["explain", "configs/data/mg_indexed.toml", "--framework", "megatron", "--seq-len", "64", "--batch-size", "2"],
     "sources[0].path: no Megatron indexed dataset at"),
    (["explain", "no/such/recipe.toml"], "no/such/recipe.toml: cannot read recipe"),
])
def test_user_errors_are_one_line_naming_the_file_or_field_and_the_fix(args, says):
    r = subprocess.run([sys.executable, "-m", "zephon_core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_a_missing_standalone_tokenizer_names_the_field_and_the_file(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(DEMO.read_text().replace('"../corpus/', f'"{ROOT}/configs/corpus/').replace("tokenizer.json", "gone.json"))
    r = zephon("explain", str(recipe))
    assert r.returncode == 1 and "standalone.tokenizer" in r.stderr and "gone.json: no such file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_debug_shows_the_traceback():
    for args, env in ((["--debug", "explain", "no/such.toml"], {}), (["explain", "no/such.toml", "--debug"], {}), (["explain", "no/such.toml"], {"ZEPHON_DEBUG": "1"})):
        r = subprocess.run([sys.executable, "-m", "zephon_core.cli", *args], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
        assert r.returncode == 1 and "Traceback" in r.stderr and "ConfigError" in r.stderr, (args, r.stderr)


def test_a_missing_package_names_the_extra():
    from zephon_core.cli.errors import one_line

    assert one_line(ModuleNotFoundError("No module named 'tokenizers'", name="tokenizers")).endswith("pip install 'zephon-suite[tokenizers]'")
    assert one_line(ModuleNotFoundError("x", name="pyarrow.parquet")).endswith("pip install 'zephon-suite[parquet]'")
    assert one_line(FileNotFoundError(2, "No such file or directory", "/x/y")) == "/x/y: No such file or directory"


def test_trace_shows_progress_on_request():
    r = zephon("trace", str(DEMO), "--step", "2", "--progress")
    assert r.returncode == 0 and "16/16" in r.stderr and "step 2" in r.stderr
    assert zephon("trace", str(DEMO), "--step", "2").stderr == ""  # not a terminal: quiet


def test_init_writes_the_bundled_configs_and_never_overwrites(tmp_path):
    r = zephon("init", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "configs" / "data" / "demo.toml").read_bytes() == DEMO.read_bytes()
    assert (tmp_path / "configs" / "corpus" / "tokenizer.json").is_file()
    again = zephon("init", str(tmp_path))
    assert again.returncode == 1 and "--force" in again.stderr
    assert zephon("init", str(tmp_path), "--force").returncode == 0
    r = subprocess.run([sys.executable, "-m", "zephon_core.cli", "explain", "configs/data/demo.toml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr


def test_explain_refuses_a_topology_the_adapters_refuse_in_their_words():
    """dp_degree 3 on 4 lanes: both adapters refuse to start (integration.rules); explain says the same, exit 1."""
    from zephon_core.integration.rules import Topology, topology_problems
    from zephon_torchtitan.core import TERMS

    shape = ["--framework", "torchtitan", "--tokenizer", "configs/corpus"]
    r = zephon("explain", "configs/data/tt_train.toml", "--dp-degree", "3", *shape, cwd=ROOT)
    assert r.returncode == 1 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert "Warning" not in r.stderr and "builder.py" not in r.stderr, r.stderr
    (adapter,) = topology_problems(Topology(3, 4, None), TERMS)
    assert adapter.split(" (")[0] in r.stderr and "among [1, 2, 4]" in r.stderr, r.stderr
    assert "(--dp-degree)" in r.stderr, r.stderr
    r = zephon("explain", "configs/data/tt_train.toml", "--dp-degree", "2", "--batches-per-step", "6", *shape, cwd=ROOT)
    assert r.returncode == 1 and "pass --batches-per-step 8" in r.stderr, r.stderr
    assert zephon("explain", "configs/data/tt_train.toml", "--dp-degree", "2", *shape, cwd=ROOT).returncode == 0


def test_version_and_a_bare_zephon():
    """`zephon --version` prints the installed version; a bare `zephon` is a usage error that shows the help."""
    from importlib import metadata

    r = zephon("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"zephon {metadata.version('zephon-suite')}", r.stdout + r.stderr
    r = zephon()
    assert r.returncode == 2 and r.stdout.startswith("usage: zephon"), r.stdout + r.stderr
    assert "verify-elastic" in r.stdout
    assert r.stderr == ""


def test_output_piped_into_a_reader_that_stops_early_is_not_an_error():
    """`zephon explain ... | head`: a reader that closes the pipe early (here at once) ends the command quietly."""
    cmd = f"{sys.executable} -m zephon_core.cli explain {DEMO} --dp-degree 2 | true; exit ${{PIPESTATUS[0]}}"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "BrokenPipe" not in r.stderr and "unexpected" not in r.stderr, r.stderr
