"""``zephon quarantine --document HASH`` (issue #35): a content hash the ledger prints names every document with
that content, found by one pass over the recipe's sources or in a ledger's Parquet file, the same either way; a
hash nothing has is refused in one line naming it and where it looked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon

from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.verify.ledger import content_hash
from zephon_core.verify.simulate import Phase, run_phase

ROOT = Path(__file__).resolve().parents[4]
COPIES = (3, 20, 35)  # document 3 of the corpus is copied to these places


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A recipe over 40 real documents, one of them three times, and its state after every document trained once."""
    out = tmp_path_factory.mktemp("dup")
    lines = (ROOT / "configs" / "corpus" / "stdlib_docs.jsonl").read_text().splitlines()[:40]
    for n in COPIES[1:]:
        lines[n] = lines[COPIES[0]]
    (out / "dup.jsonl").write_text("\n".join(lines) + "\n")
    recipe = out / "dup.toml"
    recipe.write_text(f"""seed = 3
chunk_size = 4
canonical_replicas = 2
[[sources]]
path = "dup.jsonl"
format = "jsonl"
text_field = "text"
weight = 1.0
[standalone]
tokenizer = "{ROOT / 'configs' / 'corpus' / 'tokenizer.json'}"
bos_id = 0
eos_id = 1
seq_len = 128
batch_size = 2
""")
    from zephon_core.recipe import load_recipe

    def make(G: int, g: int):
        return load_recipe(recipe).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)

    _, state = run_phase(make, Phase(2, 40), 2, None)
    (out / "state.json").write_text(json.dumps(state))
    r = zephon("ledger", str(recipe), "--state", str(out / "state.json"), "--parquet", str(out / "ledger.parquet"))
    assert r.returncode == 0, r.stderr
    return out, recipe, content_hash(json.loads(lines[COPIES[0]])["text"])


def _quarantine(run, *args: str) -> tuple[object, dict]:
    out, recipe, _ = run
    r = zephon("quarantine", str(recipe), "--state", str(out / "state.json"), "--out", str(out / "q.json"), *args)
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "q.json").read_text())


def test_a_hash_quarantines_every_copy_of_the_document(run):
    _, _, h = run
    r, state = _quarantine(run, "--document", h, "--document", "dup.jsonl#7")
    copies = [("dup.jsonl", n) for n in COPIES]
    assert f"{h}: " + ", ".join(f"dup.jsonl#{n}" for n in COPIES) in r.stdout
    assert surgery_journal_of(state).quarantines[0].documents == tuple(sorted([*copies, ("dup.jsonl", 7)]))


def test_the_ledger_parquet_gives_the_documents_the_scan_gives(run):
    out, _, h = run
    _, scanned = _quarantine(run, "--document", h)
    r, looked_up = _quarantine(run, "--document", h, "--ledger", str(out / "ledger.parquet"))
    assert looked_up == scanned and len(surgery_journal_of(looked_up).quarantines[0].documents) == len(COPIES)


def test_a_hash_no_document_has_is_refused_naming_it_and_where_it_looked(run):
    out, recipe, _ = run
    for extra, where in (((), "every document of dup.jsonl"), (("--ledger", str(out / "ledger.parquet")), "ledger")):
        r = zephon("quarantine", str(recipe), "--state", str(out / "state.json"), "--out", str(out / "bad.json"),
                   "--document", "0123456789abcdef", *extra)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "--document 0123456789abcdef" in r.stderr and where in r.stderr
        assert not (out / "bad.json").exists()
