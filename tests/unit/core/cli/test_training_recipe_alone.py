"""``zephon report --recipe`` and ``zephon diff CHECKPOINT RECIPE`` with a training recipe (no [standalone]) and
without the run's shape: it is asked for only where the answer needs it, and then named (issue #36).

A run of configs/data/tt_train.toml as each framework tokenizes it (64-token rows, batches of 2) writes its
audit log and its state; the commands read them as a user would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon

from zephon_core.integration.batch_log import log_line
from zephon_core.recipe import load_recipe
from zephon_core.verify.shape import Shape, build

ROOT = Path(__file__).resolve().parents[4]
TT_TRAIN = ROOT / "configs" / "data" / "tt_train.toml"
CORPUS = ROOT / "configs" / "corpus"


def _run(folder: Path, framework: str) -> tuple[Path, Path]:
    """Six batches of tt_train as ``framework`` tokenizes it: the audit log and the state after them."""
    p = build(load_recipe(TT_TRAIN), Shape(str(CORPUS), 64, 2, framework), prefetch=0)
    batches = iter(p)
    log = folder / "batches-rank0.log"
    log.write_text("".join(log_line(next(batches)) for _ in range(6)))
    state = folder / "state.json"
    state.write_text(json.dumps(p.checkpoint()))
    return log, state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for framework in ("torchtitan", "megatron"):
        folder = tmp_path_factory.mktemp(framework)
        out[framework] = _run(folder, framework)
    return out


def _ok(*args: str) -> str:
    r = zephon(*args, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _refused(*args: str) -> str:
    r = zephon(*args, cwd=ROOT)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_report_names_a_checkpoints_sources_with_the_recipe_alone(runs):
    log, state = runs["torchtitan"]
    out = _ok("report", str(state), "--recipe", str(TT_TRAIN))
    assert "stdlib_docs.jsonl" in out and f"sizes from {TT_TRAIN}" in out and "epochs: ?" not in out, out
    # A recipe of other sources is still refused, by their fingerprints.
    assert "its sources are not those of the checkpoint" in _refused("report", str(state), "--recipe",
                                                                     "configs/data/curriculum_main.toml")


def test_report_on_audit_logs_with_the_recipe_alone_and_the_padding_with_the_rows_shape(runs):
    log, _ = runs["torchtitan"]
    alone = _ok("report", str(log), "--recipe", str(TT_TRAIN))
    assert "stdlib_docs.jsonl" in alone and "padding: not known" in alone and "--seq-len and --batch-size" in alone
    sized = _ok("report", str(log), "--recipe", str(TT_TRAIN), "--seq-len", "64", "--batch-size", "2")
    shaped = _ok("report", str(log), "--recipe", str(TT_TRAIN), "--framework", "torchtitan", "--tokenizer", str(CORPUS),
                 "--seq-len", "64", "--batch-size", "2")
    assert sized == shaped and "padding: 0.00% of row tokens" in sized, sized
    assert alone.replace(alone.split("padding: ")[1].split("\n")[0], "") == sized.replace("0.00% of row tokens", "")


def test_a_training_curriculum_that_counts_tokens_of_text_names_the_shape_it_needs(runs, tmp_path):
    """Its stage boundaries are tokens of the run's tokenizer: the report cannot place them without it."""
    log, _ = runs["torchtitan"]
    text = (ROOT / "configs" / "data" / "curriculum.toml").read_text()
    recipe = tmp_path / "curriculum_training.toml"
    recipe.write_text(text[:text.index("[standalone]")].replace('"../corpus/', f'"{CORPUS}/'))
    err = _refused("report", str(log), "--recipe", str(recipe))
    assert f"{recipe}: its stages count tokens" in err and "pass --framework, --tokenizer, --seq-len" in err, err


@pytest.mark.parametrize("framework", ["torchtitan", "megatron"])
def test_diff_takes_the_runs_shape_and_tokenization_from_the_checkpoint(runs, framework):
    _, state = runs[framework]
    out = _ok("diff", str(state), str(TT_TRAIN), "--tokenizer", str(CORPUS))
    assert out.startswith("accepted: same data definition"), out
    # Told the other framework, the tokenization (BOS or not) differs: the command line wins.
    other = {"torchtitan": "megatron", "megatron": "torchtitan"}[framework]
    r = zephon("diff", str(state), str(TT_TRAIN), "--tokenizer", str(CORPUS), "--framework", other, cwd=ROOT)
    assert r.returncode == 1 and r.stdout.startswith("refused:") and "bos_id" in r.stdout, r.stdout + r.stderr
    err = _refused("diff", str(state), str(TT_TRAIN))
    assert f"{TT_TRAIN}: a training recipe's text" in err and "pass --tokenizer" in err, err
