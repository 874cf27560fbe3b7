"""The messages of errors a user causes, swept together (issue #36): each is one line, names the file it
came from (and the recipe key, for a recipe), says what to do, and shows none of the machinery under it:
no raw exception name, no traceback, no ``file://`` URL for a local file, and never torch's advice to load
a checkpoint with ``weights_only=False`` (which runs whatever code the file holds).

The cases are the bad-input suite's own (``test_bad_input``'s recipes and JSONL rows) and the mistakes of a
new user: damaged checkpoints of every kind ``zephon inspect`` reads, a folder of another format read as
the default one, a wrong text field, missing paths.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import relkit
from test_bad_input import GOOD, JSONL_CASES, RECIPE_CASES
from test_security import Payload

from zephon_core import JsonlSource, ZephonError
from zephon_core.integration.state_readers import load_checked_state
from zephon_core.recipe import load_recipe

RAW = ("UnpicklingError", "OSError", "KeyError", "FileNotFoundError", "IsADirectoryError", "JSONDecodeError",
       "Traceback", "file://", "weights_only=False", "unexpected; run again")

MEGATRON_FILES = "train_dataloader_dprank*.pt"  # what a Megatron loader-state message tells a user to pass
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


def _recipe(folder: Path, source: str) -> Path:
    path = folder / "recipe.toml"
    path.write_text(f"seed = 1\nchunk_size = 8\n[[sources]]\n{source}\n")
    return path


def _recipe_cases(tmp: Path) -> dict[str, tuple[Callable[[], object], list[str]]]:
    """name: (what raises, words its message must hold besides the recipe's path)."""
    (tmp / "docs.jsonl").write_text(GOOD * 20)
    (tmp / "body.jsonl").write_text('{"body": "x"}\n' * 5)
    (tmp / "hf").mkdir()
    (tmp / "hf" / "data-00000-of-00001.arrow").write_bytes(b"")  # what Dataset.save_to_disk writes, by name
    (tmp / "hf" / "state.json").write_text("{}")
    (tmp / "tars").mkdir()
    for n in range(2):
        (tmp / "tars" / f"shard-{n}.tar").write_bytes(b"")
    (tmp / "empty").mkdir()
    (tmp / "empty.jsonl").write_text("\n")
    cases: dict[str, tuple[Callable[[], object], list[str]]] = {}
    for name, (text, words) in RECIPE_CASES.items():
        if words is not None:
            sub = tmp / f"r{len(cases)}"
            sub.mkdir()
            (sub / "docs.jsonl").write_text(GOOD * 20)
            (sub / "recipe.toml").write_text(text)
            cases[f"recipe: {name}"] = (lambda p=sub / "recipe.toml": load_recipe(p).work_source(), [str(sub), *words])
    user = {
        "save_to_disk folder, no format": ('path = "hf"', ["sources[0].path", f"{tmp}/hf", 'format = "arrow"']),
        "folder of .tar files, no format": ('path = "tars"', ["sources[0].path", 'format = "webdataset"']),
        "missing file": ('path = "nope.jsonl"', ["sources[0].path", f"{tmp}/nope.jsonl", "no such file"]),
        "empty folder": ('path = "empty"', ["sources[0].path", f"{tmp}/empty"]),
        "empty file": ('path = "empty.jsonl"', ["sources[0].path", f"{tmp}/empty.jsonl", "no documents"]),
        "glob matching nothing": ('paths = ["none/*.jsonl"]', ["sources[0].paths", "no file matches"]),
        "wrong text field (JSONL)": ('path = "body.jsonl"',
                                     ["sources[0].text_field", f"{tmp}/body.jsonl:1", "set text_field"]),
        "wrong text field (folder)": ('path = "."\ntext_field = "body"', ["sources[0].text_field", "docs.jsonl:1"]),
    }
    for name, (source, words) in user.items():
        cases[f"recipe: {name}"] = (lambda s=source: load_recipe(_recipe(tmp, s)).work_source(), [str(tmp), *words])
    return cases


def _state_cases(tmp: Path) -> dict[str, tuple[Callable[[], object], list[str]]]:
    p = relkit.pipeline(prefetch=0)
    next(iter(p))
    good = json.loads(json.dumps(p.checkpoint()))
    p.close()
    files = {"missing fields.json": {"a": 1}, "altered.json": {**good, "fingerprint": "0" * 64},
             "not JSON.json": "{\"format\":", "a list.json": [1]}
    cases: dict[str, tuple[Callable[[], object], list[str]]] = {}
    for name, content in files.items():
        path = tmp / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        cases[f"state: {name}"] = (lambda p=str(path): load_checked_state(p), [str(path)])
    return cases


def _torch_cases(tmp: Path) -> dict[str, tuple[Callable[[], object], list[str]]]:
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    tt = pytest.importorskip("zephon_torchtitan.state")
    cases: dict[str, tuple[Callable[[], object], list[str]]] = {}
    bad = tmp / "bad-metadata" / "step-1"
    bad.mkdir(parents=True)
    (bad / ".metadata").write_bytes(b"%PDF-1.4 not a pickle")
    cases["DCP: .metadata not a pickle"] = (lambda: load_checked_state(str(bad)), [f"{bad}/.metadata", "step-N"])
    evil = tmp / "evil-metadata" / "step-1"
    evil.mkdir(parents=True)
    (evil / ".metadata").write_bytes(pickle.dumps(Payload(str(tmp / "MARKER"))))
    cases["DCP: .metadata holding code"] = (lambda: load_checked_state(str(evil)),
                                            [f"{evil}/.metadata", "refusing to unpickle"])
    slot = tmp / "bad-slot" / "step-2"
    raw = torch.zeros(64, dtype=torch.uint8)
    raw[:8] = torch.tensor(list((5).to_bytes(8, "little")), dtype=torch.uint8)
    raw[8:13] = torch.tensor(list(b"{bad}"), dtype=torch.uint8)
    dcp.save({tt.DCP_KEY: raw}, checkpoint_id=str(slot), no_dist=True)
    cases["DCP: loader state not JSON"] = (lambda: load_checked_state(str(slot)), [str(slot), "not valid JSON"])
    pt = tmp / "random.pt"
    torch.save({"model": torch.zeros(2), "opt": Payload(str(tmp / "MARKER"))}, pt)
    cases["Megatron: a .pt holding objects"] = (lambda: load_checked_state(str(pt)), [str(pt), MEGATRON_FILES])
    junk = tmp / "junk.pt"
    junk.write_bytes(b"%not a torch file")
    cases["Megatron: not a torch file"] = (lambda: load_checked_state(str(junk)), [str(junk), MEGATRON_FILES])
    return cases


def _jsonl_cases(tmp: Path) -> dict[str, tuple[Callable[[], object], list[str]]]:
    cases: dict[str, tuple[Callable[[], object], list[str]]] = {}
    for n, (name, (content, line, words)) in enumerate(JSONL_CASES.items()):
        path = tmp / f"bad{n}.jsonl"
        path.write_bytes(content.encode("latin-1") if "\xe9" in content else content.encode())
        cases[f"JSONL: {name}"] = (lambda p=str(path): JsonlSource(p), [f"{path}:{line}:", *words])
    return cases


def test_every_message_names_its_file_in_one_line_without_internals(tmp_path, rel):
    cases = {}
    for make in (_recipe_cases, _state_cases, _jsonl_cases, _torch_cases):
        folder = tmp_path / make.__name__.strip("_")
        folder.mkdir()
        cases.update(make(folder))
    failures = []
    for name, (act, words) in cases.items():
        try:
            act()
        except ZephonError as e:
            msg = str(e)
            problems = [f"shows {w!r}" for w in RAW if w in msg]
            problems += [f"does not name {w!r}" for w in words if w not in msg]
            problems += ["more than one line"] if "\n" in msg.strip() else []
            if problems:
                failures.append(f"{name}: {', '.join(problems)}: {msg[:300]!r}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: a bare {type(e).__name__}: {str(e)[:200]!r}")
        else:
            failures.append(f"{name}: accepted")
    if (tmp_path / "torch_cases" / "MARKER").exists():
        failures.append("reading a checkpoint ran the code pickled in it")
    verdict = "one line, file and key named" if not failures else f"FAILED {len(failures)}"
    rel.case(f"error messages swept ({len(cases)})", verdict)
    assert not failures, "\n".join(failures)
