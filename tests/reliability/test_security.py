"""Nothing loaded is executed; cached indexes are validated before use;
written state files are not writable by others.

Pickle payloads below would create a marker file if anything unpickled them;
the tests plant them where a loader might read and check that the marker
never appears and that the loader refuses the file or rebuilds what it needs.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
import relkit

from zephon_core import AggregationError, DataError, JsonlSource, StateError, TokenArraySource
from zephon_core.checkpoint.records import Round, encode_round
from zephon_core.checkpoint.tree import Writers
from zephon_core.errors import ConfigError
from zephon_core.integration.state_readers import StateReadError, load_state
from zephon_core.io import index_cache
from zephon_core.recipe import load_recipe
from zephon_core.sources.jsonl import JsonlFile

CORE = relkit.REPO / "zephon_core"
ADAPTERS = [relkit.REPO / "integrations" / "torchtitan" / "zephon_torchtitan", relkit.REPO / "integrations" / "megatron" / "zephon_megatron"]


class Payload:
    """Unpickling this creates ``path`` (and nothing else)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def payload_bytes(marker: Path) -> bytes:
    return pickle.dumps(Payload(str(marker)))


# -- source scan ------------------------------------------------------------------------
_UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}


def _unsafe_calls(path: Path, strict_imports: bool) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    where = lambda n: f"{path.relative_to(relkit.REPO)}:{n.lineno}"  # noqa: E731
    for node in ast.walk(tree):
        if strict_imports and isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if n.split(".")[0] in _UNSAFE_MODULES:
                    found.append(f"{where(node)}: import {n}")
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "pickle.Unpickler" for b in node.bases):
            # an unpickler is allowed only restricted: its find_class decides which classes a file may build
            if not any(isinstance(d, ast.FunctionDef) and d.name == "find_class" for d in node.body):
                found.append(f"{where(node)}: a pickle.Unpickler without its own find_class")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        kwargs = {k.arg: k.value for k in node.keywords}
        if isinstance(f, ast.Name) and name in ("eval", "exec", "__import__", "compile"):
            found.append(f"{where(node)}: {name}()")
        if owner in _UNSAFE_MODULES and name in ("load", "loads", "Unpickler", "open"):
            found.append(f"{where(node)}: {owner}.{name}()")
        if name == "load" and owner in ("np", "numpy"):
            v = kwargs.get("allow_pickle")
            if not (isinstance(v, ast.Constant) and v.value is False):
                found.append(f"{where(node)}: np.load without allow_pickle=False")
        if name == "load" and owner == "torch":
            v = kwargs.get("weights_only")
            if not (isinstance(v, ast.Constant) and v.value is True):
                found.append(f"{where(node)}: torch.load without weights_only=True")
        if name in ("load", "unsafe_load", "full_load") and owner == "yaml":
            found.append(f"{where(node)}: yaml.{name}()")
        if kwargs.get("allow_pickle") is not None:
            v = kwargs["allow_pickle"]
            if not (isinstance(v, ast.Constant) and v.value is False):
                found.append(f"{where(node)}: allow_pickle={ast.unparse(v)}")
    return found


def test_no_pickle_eval_or_exec_in_the_code_that_loads_things(rel):
    core = sorted(CORE.rglob("*.py"))
    adapters = sorted(p for d in ADAPTERS if d.exists() for p in d.rglob("*.py"))
    found = [f for p in core for f in _unsafe_calls(p, strict_imports=True)]
    # The adapters may import pickle for its exception type, never to load with it.
    found += [f for p in adapters for f in _unsafe_calls(p, strict_imports=False)]
    rel.case(f"source scan of {len(core)} core and {len(adapters)} adapter files", "clean" if not found else f"FAILED {found}")
    assert not found, found
    # and the scan does catch what it looks for
    probe = relkit.REPO / ".artifacts" / "reliability" / "scan_probe.py"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("import pickle\nimport numpy as np\nimport torch\neval('1')\nnp.load('x', allow_pickle=True)\n"
                     "torch.load('x')\npickle.loads(b'')\nclass Open(pickle.Unpickler):\n    pass\n")
    assert {int(f.split(":")[1]) for f in _unsafe_calls(probe, strict_imports=True)} == {1, 4, 5, 6, 7, 8}
    probe.unlink()


# -- planted payloads -----------------------------------------------------------------------
def _jsonl(tmp_path: Path, n: int = 300) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(n)))
    return path


def _cache_file(cache_dir: Path) -> Path:
    files = list(cache_dir.glob("*.npz"))
    assert len(files) == 1, files
    return files[0]


def test_index_cache_with_an_object_array_is_rebuilt_not_unpickled(tmp_path, rel, private_index_cache):
    path = _jsonl(tmp_path)
    JsonlSource(str(path))
    cache = _cache_file(private_index_cache)
    with np.load(cache, allow_pickle=False) as d:
        arrays = {k: d[k] for k in d.files}
    marker = tmp_path / "MARKER-npz"
    # the right fingerprint (so only the arrays are suspect), object arrays holding the payload
    evil = dict(arrays, starts=np.array([Payload(str(marker))] * 3, dtype=object), lines=np.array([Payload(str(marker))], dtype=object))
    np.savez(cache, **evil)
    src = JsonlSource(str(path))
    assert not marker.exists(), "the index cache was unpickled"
    assert len(src) == 300 and src.read([299, 0]) == ["doc 299", "doc 0"]
    # and a cache file that is a bare pickle stream
    cache.write_bytes(payload_bytes(marker))
    src = JsonlSource(str(path))
    assert not marker.exists() and len(src) == 300
    rel.case("index cache .npz with object arrays / a bare pickle", "rebuilt, never unpickled", samples=2)


def test_state_files_holding_pickles_are_refused(tmp_path, rel):
    marker = tmp_path / "MARKER-state"
    path = tmp_path / "state.json"
    path.write_bytes(payload_bytes(marker))
    with pytest.raises(StateReadError) as e:
        load_state(str(path))
    assert str(path) in str(e.value)
    with pytest.raises(StateError):
        relkit.pipeline().restore(payload_bytes(marker))  # type: ignore[arg-type]
    # JSON that names a Python object is just data, and the wrong data
    path.write_text(json.dumps({"py/object": "os.system", "__reduce__": ["os.system", ["touch " + str(marker)]]}))
    with pytest.raises(StateError) as e:
        relkit.pipeline().restore(load_state(str(path)))
    assert "missing field" in str(e.value)
    assert not marker.exists()
    rel.case("state file: pickle bytes / JSON naming Python objects", "refused")


def test_token_array_holding_a_pickle_is_refused(tmp_path, rel):
    marker = tmp_path / "MARKER-npy"
    np.save(tmp_path / "tokens.npy", np.array([Payload(str(marker))] * 4, dtype=object), allow_pickle=True)
    np.save(tmp_path / "offsets.npy", np.array([0, 4]))
    with pytest.raises(DataError) as e:
        TokenArraySource(str(tmp_path / "tokens.npy"), str(tmp_path / "offsets.npy"))
    assert "tokens.npy" in str(e.value)
    assert not marker.exists()
    rel.case("token array .npy with pickled objects", "DataError naming the file")


def test_recipe_holding_a_pickle_is_refused(tmp_path, rel):
    marker = tmp_path / "MARKER-recipe"
    path = tmp_path / "recipe.toml"
    path.write_bytes(payload_bytes(marker))
    with pytest.raises(ConfigError) as e:
        load_recipe(path)
    assert str(path) in str(e.value)
    assert not marker.exists()
    rel.case("recipe file that is a pickle", "ConfigError naming the file")


def test_follower_refuses_a_merged_file_holding_a_pickle(tmp_path, rel):
    """The test plays the leader: it opens a round and publishes a pickle as the merged state."""
    marker = tmp_path / "MARKER-merged"
    agg = tmp_path / "agg"
    follower = relkit.pipeline(world_size=2, global_rank=1, dp_degree=2, dp_group_id=1, aggregate_dir=str(agg), run_id="job",
                               aggregate_timeout_s=30, prefetch=0)
    (agg / "job").mkdir(parents=True)
    token = "f" * 32
    (agg / "job" / "round.json").write_bytes(encode_round(Round(token, 1, Writers(2, 2)), True))
    t, out = relkit.checkpoint_in_thread(follower)
    relkit.wait_for(lambda: token in (agg / "job" / "part-1.json").read_text(errors="replace") if (agg / "job" / "part-1.json").exists() else False,
                    30, "the follower's part")
    tmp = agg / "job" / ".tmp-evil"
    tmp.write_bytes(payload_bytes(marker))
    tmp.replace(agg / "job" / f"merged-{token}.json")
    t.join(60)
    follower.close()
    assert not t.is_alive()
    assert isinstance(out.get("error"), AggregationError), out
    assert f"merged-{token}.json" in str(out["error"])
    assert not marker.exists()
    rel.case("merged file holding a pickle (follower side)", "AggregationError naming the file")


# -- cached indexes are checked against the source ---------------------------------------------
def _count_builds(monkeypatch) -> list:
    calls: list = []
    original = JsonlFile._build_index
    monkeypatch.setattr(JsonlFile, "_build_index", lambda self, *whole: calls.append(1) or original(self, *whole))
    return calls


def test_cache_is_rebuilt_when_the_source_changes_with_the_same_size(tmp_path, rel, monkeypatch):
    builds = _count_builds(monkeypatch)
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "aa"}\n{"text": "b"}\n')
    assert JsonlSource(str(path)).read([0, 1]) == ["aa", "b"]
    st = path.stat()
    path.write_text('{"text": "a"}\n{"text": "bb"}\n')  # same size, other line boundaries
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    assert path.stat().st_size == st.st_size
    assert JsonlSource(str(path)).read([0, 1]) == ["a", "bb"]
    assert len(builds) == 2
    # a cache built for another file, copied into this file's slot
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "zz"}\n')
    JsonlSource(str(other))
    root = Path(os.environ["ZEPHON_CACHE_DIR"])
    slot = lambda p: index_cache.cache_path(root, "file://" + str(p), "jsonl:text")  # noqa: E731
    assert slot(path).exists() and slot(other).exists()
    slot(path).write_bytes(slot(other).read_bytes())
    assert JsonlSource(str(path)).read([0, 1]) == ["a", "bb"]
    assert len(builds) == 4
    rel.case("source rewritten with the same size and mtime; another file's cache", "rebuilt", samples=6)


@pytest.mark.parametrize("damage", ["one byte flipped", "truncated", "empty"])
def test_damaged_cache_is_rebuilt(tmp_path, rel, damage, private_index_cache):
    path = _jsonl(tmp_path)
    JsonlSource(str(path))
    cache = _cache_file(private_index_cache)
    data = bytearray(cache.read_bytes())
    if damage == "one byte flipped":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    cache.write_bytes(bytes(data))
    try:
        src = JsonlSource(str(path))
    except Exception as e:  # noqa: BLE001
        rel.case(f"index cache {damage}", f"FAILED: {type(e).__name__}: {e}")
        raise AssertionError(f"a damaged index cache ({damage}) raised {type(e).__name__}: {e}; it should be ignored and rebuilt") from None
    assert len(src) == 300 and src.read([123]) == ["doc 123"]
    rel.case(f"index cache {damage}", "rebuilt", samples=1)


def test_cache_with_the_right_fingerprint_but_a_shortened_index_is_not_trusted(tmp_path, rel, private_index_cache):
    """The arrays of a cache file are data too: a cache whose index lost its
    tail (same fingerprint) must not silently drop the last documents."""
    path = _jsonl(tmp_path)
    JsonlSource(str(path))
    cache = _cache_file(private_index_cache)
    with np.load(cache, allow_pickle=False) as d:
        arrays = {k: d[k] for k in d.files}
    np.savez(cache, **{k: (v if k == "fingerprint" else v[:10]) for k, v in arrays.items()})
    n = len(JsonlSource(str(path)))
    rel.case("index cache shortened, fingerprint kept", "rebuilt" if n == 300 else f"FAILED: {n} of 300 documents, silently")
    assert n == 300, f"the source now has {n} documents instead of 300: the rest would be silently skipped"


# -- file modes ------------------------------------------------------------------------------------
def _writable_by_others(p: Path) -> bool:
    return bool(p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def test_written_state_and_cache_files_are_not_writable_by_others(tmp_path, rel, private_index_cache):
    old = os.umask(0)  # the most permissive umask a job could have
    try:
        agg = tmp_path / "agg"
        pipes = [relkit.pipeline(world_size=2, global_rank=r, dp_degree=2, dp_group_id=r, aggregate_dir=str(agg), run_id="job",
                                 aggregate_timeout_s=60, prefetch=0) for r in range(2)]
        seen: dict[str, int] = {}
        stop = threading.Event()

        def watch() -> None:  # records the mode of every file while the round is on
            while not stop.is_set():
                for p in (agg / "job").glob("*") if (agg / "job").exists() else []:
                    try:
                        seen[p.name] = p.stat().st_mode
                    except FileNotFoundError:
                        pass

        w = threading.Thread(target=watch)
        w.start()
        results: list = [None, None]
        ts = [threading.Thread(target=lambda r=r: results.__setitem__(r, pipes[r].checkpoint())) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        stop.set()
        w.join(10)
        for p in pipes:
            p.close()
        assert results[0] is not None and results[0] == results[1]
        JsonlSource(str(_jsonl(tmp_path)))
    finally:
        os.umask(old)
    final = {p.name: p.stat().st_mode for p in (agg / "job").iterdir()}
    seen.update(final)
    kinds = {n.split("-")[0].split(".")[0] for n in seen}
    assert {"round", "merged"} <= kinds, seen
    loose = {n: oct(m & 0o777) for n, m in seen.items() if m & (stat.S_IWGRP | stat.S_IWOTH)}
    cache = _cache_file(private_index_cache)
    rel.case(f"modes of {len(seen)} aggregation files and the index cache under umask 000",
             "not writable by group/others" if not loose and not _writable_by_others(cache) else f"FAILED {loose}")
    assert not loose, loose
    assert not _writable_by_others(cache), oct(cache.stat().st_mode)
