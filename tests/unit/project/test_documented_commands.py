"""Every command the README, docs/, configs/ and the examples show runs as written.

Each documented command (``tests/support/doc_commands.py`` finds them) must match one rule
below: run here, as written, with the project environment active; run by the named
test (the e2e launches, on CPU through the documented launchers); a synopsis whose
subcommand and options must exist; or an exemption with its reason. A command
that matches no rule fails, so a new one in the docs needs a way to be checked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_commands import ROOT, Command, documented

BIN = Path(sys.executable).parent  # the environment's bin/: zephon, python, torchrun

# (pattern on the command, how it is checked, detail)
RULES: list[tuple[str, str, str]] = [
    (r"^bash scripts/test\.sh (tests/\S+|-k \S+)( -k \S+)?$", "test", "tests/unit/project/test_test_script.py::test_a_selection_runs_only_that_and_ends_with_the_summary_line"),
    (r"^bash scripts/test\.sh --fast( -x)?$", "test",
     "tests/unit/project/test_test_script.py::"
     "test_fast_runs_lint_and_the_serial_suite_without_e2e_topology_tests_or_the_mpi_matrix"),
    (r"^bash scripts/test\.sh$", "exempt", "CI runs it (.ci/run); its selection and signal handling: tests/unit/project/test_test_script.py"),
    (r"^bash scripts/lint\.sh$", "exempt", "the first stage of scripts/test.sh"),
    (r"^bash bench/run\.sh", "exempt", "benchmarks take minutes each; docs/performance.md records their output and the command"),
    (r"\$ZEPHON_PY bench/(goals/[a-z0-9_]+/)?"
     r"(curriculum|aggregate_scale|cases|run|packing|mixing_lag|source_loss|ledger)\.py", "exempt",
     "benchmarks take minutes each; docs/performance.md (mixing_lag: docs/mixing.md; ledger: "
     "docs/when_a_run_goes_wrong.md) records output and command"),
    (r"^ZEPHON_SOAK=1 ", "exempt", "the long soak, run by hand (docs/reliability.md records its result)"),
    (r"^PYTHONPATH=\S+ \$ZEPHON_PY -m pytest tests/reliability -q", "exempt", "the suite runs tests/reliability itself"),
    (r"^python script\.py$", "exempt", "prose: how Python runs a script"),
    (r"^bash scripts/demo\.sh$", "test", "tests/e2e/test_first_run.py::test_readme_demo_runs_as_written"),
    (r"^python -m zephon_torchtitan\.cpu$", "test",
     "tests/e2e/test_first_run.py::test_torchtitan_on_a_laptop_trains_checkpoints_and_resumes_on_another_dp"),
    (r"^bash scripts/gpu_check\.sh$", "test",
     "tests/unit/project/test_gpu_check.py::test_without_cuda_it_skips_with_one_line_saying_why"),
    (r"^python -m zephon_megatron\.cpu$", "test",
     "tests/e2e/test_first_run.py::test_megatron_on_a_laptop_trains_checkpoints_and_resumes_on_another_dp"),
    (r"--job\.config_file configs/torchtitan/", "test", "tests/e2e/test_first_run.py::test_torchtitan_022_job_file_runs_as_written"),
    # docs/when_a_run_goes_wrong.md's TorchTitan rollback with a [surgery] table and its ledger (the e2e run's paths).
    (r"--checkpoint\.load_step", "test", "tests/e2e/test_surgery_torchtitan_e2e.py::"
     "test_the_skipped_steps_train_nothing_and_the_next_ones_hold_what_they_held"),
    (r"^zephon ledger .* --framework torchtitan", "test",
     "tests/e2e/test_surgery_torchtitan_e2e.py::test_the_ledger_agrees_with_the_audit_logs_on_every_step"),
    (r"--module zephon_torchtitan --config", "test", "tests/e2e/test_first_run.py::test_torchtitan_recipe_module_command_runs_as_written"),
    (r"^zephon inspect <dump>/checkpoint/step-N$", "test", "tests/e2e/test_first_run.py::test_torchtitan_022_job_file_runs_as_written"),
    # The same overrides on llama3's debug model (llama3_8b does not fit a CPU).
    (r"--override\.imports 'zephon_torchtitan\.zephon_loader=.*\"mixing\": true", "test",
     "tests/e2e/test_mixing_e2e.py::test_a_steered_run_resumed_on_another_degree_trains_on_the_replay_of_its_journal"),
    (r"--override\.imports 'zephon_torchtitan\.zephon_loader=.*zephon_torchtitan\.zephon_source_loss", "test",
     "tests/e2e/test_source_loss_e2e.py::test_torchtitan_logs_each_sources_loss_and_they_add_up_to_the_loss"),
    (r"--override\.imports 'zephon_torchtitan\.zephon_loader=.*zephon_torchtitan\.zephon_metrics", "test",
     "tests/e2e/test_torchtitan_e2e.py::test_zephon_figures_are_in_torchtitans_tensorboard_at_every_logged_step"),
    (r"--override\.imports 'zephon_torchtitan\.zephon_loader=", "test",
     "tests/e2e/test_torchtitan_e2e.py::test_every_global_step_has_the_same_samples_on_dp2_and_dp4"),
    (r"-m zephon_megatron\.pretrain_gpt|bash configs/megatron/pretrain_gpt_wheel\.sh", "test",
     "tests/e2e/test_first_run.py::test_megatron_wheel_script_trains_with_the_huggingface_tokenizer"),
    # The checkout route: the launcher running a stand-in for pretrain_gpt.py (no Megatron-LM checkout here).
    (r"-m zephon_megatron\.launch|bash configs/megatron/pretrain_gpt_checkout\.sh", "test",
     "tests/e2e/test_megatron_e2e.py::test_first_and_last_pipeline_stages_read_identical_streams"),
    (r"^zephon inspect FILE\.pt$", "test", "tests/e2e/test_megatron_e2e.py::test_loader_state_files_are_json_and_inspectable"),
    (r"^torchrun --nproc-per-node 8 docs/examples/", "test", "tests/distributed/test_guide_examples_multirank.py::test_guide_example_runs_on_8_ranks"),
    (r"^pip install \.$", "test", "tests/unit/project/test_packaging.py::test_core_wheel_alone_gives_a_working_cli_and_the_configs"),
    (r"^pip install 'zephon-suite\[tokenizers\]'$", "test", "tests/unit/project/test_packaging.py::test_core_wheel_alone_gives_a_working_cli_and_the_configs"),
    (r"^pip install \"\.\[(torchtitan|megatron)\]\"$", "test", "tests/unit/project/test_packaging.py::test_extras_name_what_each_route_imports"),
    (r"^python configs/megatron/make_indexed_corpus\.py", "run", "in a zephon init folder"),
    (r"^python scripts/watch_figures\.py$", "test",
     "tests/unit/core/report/test_report.py::test_the_docs_figures_regenerate"),
    (r"^python scripts/mixing_figure\.py$", "test",
     "tests/unit/core/report/test_mixing_report.py::test_the_docs_mixing_figure_regenerates"),
    (r"^pip install 'zephon-suite\[plot\]'$", "test", "tests/unit/project/test_packaging.py::test_extras_name_what_each_route_imports"),
    (r"^zephon index \"s3://[^\"]*\" --format megatron ", "test",
     "tests/unit/core/sources/test_megatron_s3.py::"
     "test_a_manifest_start_up_fetches_no_idx_and_each_idx_on_its_first_read"),
    (r"^pip install 'zephon-suite\[zstd\]'$", "test",
     "tests/unit/core/sources/test_at_scale.py::"
     "test_the_zstd_extra_brings_zstandard"),
    (r"^zephon index \"s3://", "test",
     "tests/unit/core/sources/test_s3.py::"
     "test_a_manifest_on_s3_is_the_one_request_at_start_up_and_every_read_checks_its_version"),
    (r"^zephon index data/shards --format webdataset$", "test",
     "tests/unit/core/sources/test_webdataset.py::"
     "test_zephon_index_writes_a_manifest_that_start_up_uses_without_opening_a_shard"),
    (r"^zephon index \S+ --format arrow$", "test",
     "tests/unit/core/sources/test_arrow.py::"
     "test_zephon_index_writes_a_manifest_that_start_up_uses_without_opening_a_data_file"),
    (r"^zephon --version$", "test", "tests/unit/core/cli/test_cli.py::test_version_and_a_bare_zephon"),
    (r"^zephon ledger \S+ --state \S+/train_dataloader_dprank\d+\.pt .*--framework megatron", "test",
     "tests/e2e/test_megatron_surgery_e2e.py::test_the_ledger_agrees_with_the_audit_logs_on_every_step"),
    (r"^zephon (skip|quarantine|ledger|blame|trace|report|verify-elastic) .*run/", "test",
     "tests/unit/core/cli/test_surgery_cli.py::test_the_documented_commands_run_as_written"),
    (r"^zephon [a-z-]+( [A-Z][A-Z0-9.]*| \[.*\]| --[a-z-]+( [A-Z0-9]+)?)*$|^zephon [a-z-]+$|^zephon [a-z |-]+$", "synopsis", ""),
    (r"^zephon from-megatron .* --out ", "run", "outside the clone"),
    (r"^zephon ", "run", ""),
    (r"^(bash scripts/demo\.sh --data-only|python -m zephon_core\.cli\.demo)$", "run", "outside the clone"),
    (r"^python -m zephon_core\.cli$", "run", "with --help"),
    (r"^python docs/examples/[a-z_]+\.py$", "run", ""),
    (r"^python -m zephon_torchft\.drill --help$", "run", ""),
    (r"^source scripts/env\.sh$", "run", ""),
]


def rule_of(c: Command) -> tuple[str, str, str]:
    for rule in RULES:
        if re.search(rule[0], c.text):
            return rule
    raise AssertionError(f"{c.where}: `{c.text}` matches no rule in {__file__}: run it there, name the test that runs it, or exempt it")


COMMANDS = documented()


def test_every_documented_command_has_a_check():
    assert len(COMMANDS) > 40
    for c in COMMANDS:
        rule_of(c)


def test_the_named_tests_exist():
    for pattern, how, detail in RULES:
        if how == "test":
            path, name = detail.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE), f"{detail} (for {pattern}) does not exist"


def env_active() -> dict[str, str]:
    """The environment after `source scripts/env.sh`: its bin/ first on PATH, no PYTHONPATH (the project is installed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(cmd: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env_active(), capture_output=True, text=True, timeout=timeout)


def test_project_is_installed_in_its_environment():
    """Without PYTHONPATH, the environment's python imports this clone (scripts/env.sh installs it editable in this clone's venv)."""
    r = run("python -c 'import zephon_core, zephon_torchtitan, zephon_megatron; print(zephon_core.__file__)'; command -v zephon", Path("/"))
    assert r.returncode == 0, r.stderr
    where, script = r.stdout.split()
    assert Path(where).resolve() == (ROOT / "zephon_core" / "__init__.py").resolve(), (
        f"the environment imports {where}: run `source scripts/env.sh` in this clone")
    assert Path(script).parent == BIN


RUNNABLE = [c for c in COMMANDS if rule_of(c)[1] == "run" and c.output is None]


@pytest.mark.parametrize("c", RUNNABLE, ids=[f"{c.where}:{c.text[:40]}" for c in RUNNABLE])
def test_runs_as_written(c, tmp_path):
    detail = rule_of(c)[2]
    cwd, text = ROOT, c.text
    if detail == "outside the clone":
        cwd, text = tmp_path, text.replace("bash scripts/", f"bash {ROOT}/scripts/")
    elif detail == "in a zephon init folder":
        pytest.importorskip("megatron.core.datasets.indexed_dataset")
        assert run("zephon init", tmp_path).returncode == 0
        cwd = tmp_path
        text = re.sub(r"\[([^\]]*)\]", r"\1", text)  # every optional argument, with the value the usage shows
        text += " && zephon explain configs/data/mg_indexed.toml --framework megatron --seq-len 64 --batch-size 2"
    elif detail == "with --help":
        text += " --help"
    elif c.text == "source scripts/env.sh":
        text = "source scripts/env.sh && command -v zephon && python -c 'import zephon_core; print(zephon_core.__file__)'"
    text = text.replace(" RECIPE ", " configs/data/demo.toml ")
    r = run(text, cwd)
    assert r.returncode == 0, f"{c.where}: `{text}` failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    if c.text == "source scripts/env.sh":
        assert r.stdout.split()[0] == str(BIN / "zephon") and Path(r.stdout.split()[1]).is_relative_to(ROOT)


SHOWN = [c for c in COMMANDS if c.output is not None]


@pytest.mark.parametrize("c", SHOWN, ids=[f"{c.where}:{c.text[:40]}" for c in SHOWN])
def test_console_examples_print_what_the_docs_show(c):
    """```console blocks: the lines under a command are what it prints (whatever its exit status)."""
    r = run(c.text, ROOT)
    assert r.stdout.strip() == c.output, f"{c.where}: `{c.text}` printed:\n{r.stdout}\n{r.stderr}"


def test_synopses_name_real_subcommands_and_options():
    from zephon_core.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    for c in COMMANDS:
        if rule_of(c)[1] != "synopsis":
            continue
        words = c.text.split()[1:]
        names = [w for w in words if w != "|"] if "|" in c.text else words[:1]
        for name in names:
            assert name in sub, f"{c.where}: `{c.text}`: no subcommand {name!r}"
        if "|" not in c.text:
            known = {o for a in sub[names[0]]._actions for o in a.option_strings}
            options = set(re.findall(r"--[a-z][a-z-]*", c.text))
            assert options <= known, f"{c.where}: `{c.text}`: unknown options {sorted(options - known)}"
