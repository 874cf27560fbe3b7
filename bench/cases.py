"""One benchmark measurement per process: ``python bench/cases.py CASE 'JSON-ARGS'``.

``bench/run.py`` starts every case in a fresh subprocess, with the interpreter of the
environment that holds the loader under test (the project venv for zephon_core,
torchdata, megatron-core and the baselines; the peers venv for ``zephon`` 0.2.0 and
Grain). The case prints ``RESULT <json>`` as its last line. Nothing here asserts a
goal: run.py compares and reports.

All loaders read the same generated corpus (bench/corpus.py) with the same
``tokenizers`` BPE, append EOS (id 1) to each document, concatenate and split into
rows of ``seq_len + 1`` tokens and deliver ``[batch, seq_len]`` input/label arrays.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EOS = 1
perf = time.perf_counter


# ----------------------------------------------------------------------------- helpers
def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def children_cpu_s() -> float:
    try:
        import psutil
    except ImportError:
        return 0.0
    total = 0.0
    for c in psutil.Process().children(recursive=True):
        try:
            t = c.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def children_rss_mb() -> float:
    try:
        import psutil
    except ImportError:
        return 0.0
    total = 0.0
    for c in psutil.Process().children(recursive=True):
        try:
            total += c.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return total


class JsonlDocs:
    """Random access to the ``text`` of each line of a JSONL file (byte-offset index)."""

    def __init__(self, path: str) -> None:
        import numpy as np

        data = np.fromfile(path, dtype=np.uint8)
        ends = np.flatnonzero(data == 10)
        self.starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        self.lengths = (ends - self.starts).astype(np.int64)
        self.path = path
        self._fd: int | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def text(self, i: int) -> str:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return json.loads(os.pread(self._fd, int(self.lengths[i]), int(self.starts[i])))["text"]

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_fd"] = None
        return d


def doc_order(n: int, seed: int, epoch: int):
    import numpy as np

    return np.random.default_rng([seed, epoch]).permutation(n)


def load_tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def run_throughput(make: Callable[[], Iterator[Any]], tokens_of: Callable[[Any], int], a: dict) -> dict:
    """Time to first batch, then steady-state batches/s and tokens/s after a warm-up."""
    t0 = perf()
    it = make()
    first = next(it)
    n_tok = tokens_of(first)
    ttfb = perf() - t0
    for _ in range(a.get("warmup", 5)):
        tokens_of(next(it))
    n = toks = 0
    t1 = perf()
    cpu0 = time.process_time()
    ccpu0 = children_cpu_s()
    while True:
        toks += tokens_of(next(it))
        n += 1
        el = perf() - t1
        if (el >= a.get("min_s", 3.0) and n >= a.get("min_batches", 30)) or n >= a.get("max_batches", 10**6) or el >= a.get("max_s", 30.0):
            break
    cpu = time.process_time() - cpu0
    ccpu = children_cpu_s() - ccpu0
    return {
        "batches": n,
        "seconds": el,
        "batches_per_s": n / el,
        "tokens_per_s": toks / el,
        "tokens_per_batch": n_tok,
        "ttfb_s": ttfb,
        "cpu_s_per_s": cpu / el,
        "children_cpu_s_per_s": ccpu / el,
        "tokens_per_cpu_s": toks / max(cpu + ccpu, 1e-9),
        "children_rss_mb": children_rss_mb(),
        "_it": it,
    }


def finish(res: dict, base_rss: float) -> None:
    it = res.pop("_it", None)
    res["rss_base_mb"] = base_rss
    res["rss_peak_mb"] = peak_rss_mb()
    res["rss_beyond_mb"] = res["rss_peak_mb"] - base_rss
    res["loadavg"] = os.getloadavg()
    for closer in ("close", "shutdown"):
        fn = getattr(it, closer, None)
        if callable(fn):
            try:
                fn()
            except Exception:
                pass
    print("RESULT " + json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- loaders
def zc_tokenize_pipeline(a: dict, parallelism: int | None = None, **options):
    from zephon_core import JsonlSource, Pipeline, StaticMixture

    tok = load_tokenizer(a["tokenizer"])
    src = JsonlSource(a["jsonl"], cache_dir=a["index_cache"])
    p = (
        Pipeline(StaticMixture([src], seed=a["seed"], chunk_size=a.get("chunk_size", 64)))
        .tokenize(tok, eos_id=EOS, parallelism=parallelism or a.get("parallelism", 1))
        .pack(a["seq_len"])
        .batch(a["batch"])
    )
    return p.options(**options) if options else p


def zc_pretok_pipeline(a: dict, kind: str, **options):
    from zephon_core import MegatronIndexedSource, Pipeline, StaticMixture, TokenArraySource

    src = TokenArraySource(a["tokens"], a["offsets"]) if kind == "npy" else MegatronIndexedSource(a["megatron"])
    p = Pipeline(StaticMixture([src], seed=a["seed"], chunk_size=a.get("chunk_size", 64))).pack(a["seq_len"]).batch(a["batch"])
    return p.options(**options) if options else p


def zephon020_pipeline(a: dict, parallelism: int | None):
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    tok = load_tokenizer(a["tokenizer"])

    def encode(payload):
        return {"input_ids": tok.encode(payload["text"], add_special_tokens=False).ids + [EOS]}

    ds = Dataset.from_path("corpus", a["shards"])
    ws = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"corpus": 1.0}), seed=a["seed"])
    return (
        Pipeline(ws)
        .decode_text()
        .map_transform(encode, parallelism=parallelism)
        .pack_flat(a["seq_len"] + 1, algorithm="wrap", tokens_field="input_ids")
        .batch(a["batch"])
    )


def zephon020_tokens(b) -> int:
    t = b.to_training(return_labels=True)
    x = t["input_ids"]
    assert tuple(x.shape) == (8, 512), x.shape
    return int(x.size)


def torchdata_loader(a: dict, num_workers: int):
    import numpy as np
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
    from torchdata.stateful_dataloader import StatefulDataLoader

    L = a["seq_len"] + 1

    class TokPack(IterableDataset):
        """Tokenize + concat-split packing, stateful: (epoch, documents consumed, token buffer)."""

        def __init__(self) -> None:
            self.docs = JsonlDocs(a["jsonl"])
            self.tok = load_tokenizer(a["tokenizer"])
            self._resume: dict | None = None
            self._state = {"epoch": 0, "pos": 0, "buf": []}

        def state_dict(self) -> dict:
            return {"epoch": self._state["epoch"], "pos": self._state["pos"], "buf": list(self._state["buf"])}

        def load_state_dict(self, sd: dict) -> None:
            self._resume = sd

        def __iter__(self):
            wi = get_worker_info()
            W, wid = (wi.num_workers, wi.id) if wi else (1, 0)
            st = self._resume or {"epoch": 0, "pos": 0, "buf": []}
            self._resume = None
            epoch, pos, buf = st["epoch"], st["pos"], list(st["buf"])
            while True:
                mine = doc_order(len(self.docs), a["seed"], epoch)[wid::W]
                while pos < len(mine):
                    buf.extend(self.tok.encode(self.docs.text(int(mine[pos])), add_special_tokens=False).ids)
                    buf.append(EOS)
                    pos += 1
                    while len(buf) >= L:
                        row = np.asarray(buf[:L], dtype=np.int64)
                        del buf[:L]
                        self._state = {"epoch": epoch, "pos": pos, "buf": buf}
                        yield row
                epoch, pos = epoch + 1, 0

    def collate(rows):
        x = torch.from_numpy(np.stack(rows))
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    ds = TokPack()
    kw = {"persistent_workers": False, "multiprocessing_context": "fork"} if num_workers else {}
    return StatefulDataLoader(ds, batch_size=a["batch"], num_workers=num_workers, collate_fn=collate, **kw)


def grain_dataset(a: dict):
    import grain
    import grain.experimental as ge
    import numpy as np

    docs = JsonlDocs(a["jsonl"])
    tok = load_tokenizer(a["tokenizer"])

    class Source:
        def __len__(self):
            return len(docs)

        def __getitem__(self, i):
            return docs.text(int(i))

    def encode(text):
        return {"tokens": np.asarray(tok.encode(text, add_special_tokens=False).ids + [EOS], dtype=np.int32)}

    ds = grain.MapDataset.source(Source()).shuffle(seed=a["seed"]).repeat().map(encode).to_iter_dataset()
    ds = ge.ConcatThenSplitIterDataset(ds, length_struct={"tokens": a["seq_len"] + 1})
    return ds.batch(a["batch"], drop_remainder=True)


def grain_tokens(b) -> int:
    x = b["tokens"][:, :-1]
    assert x.shape == (8, 512), x.shape
    _ = b["tokens"][:, 1:]
    return int(x.size)


def generator(a: dict) -> Iterator[dict]:
    """The plain-Python upper bound: read, tokenize 64 documents at a time, concat, split, stack."""
    import numpy as np

    docs = JsonlDocs(a["jsonl"])
    tok = load_tokenizer(a["tokenizer"])
    L, B = a["seq_len"] + 1, a["batch"]
    need = L * B
    pend_t: list = []
    pend_p: list = []
    have = 0
    epoch = 0
    while True:
        order = doc_order(len(docs), a["seed"], epoch)
        for c in range(0, len(order), 64):
            enc = tok.encode_batch([docs.text(int(i)) for i in order[c : c + 64]], add_special_tokens=False)
            for e in enc:
                ids = np.asarray(e.ids + [EOS], dtype=np.int64)
                pend_t.append(ids)
                pend_p.append(np.arange(len(ids), dtype=np.int64))
                have += len(ids)
            if have >= need:
                t, p = np.concatenate(pend_t), np.concatenate(pend_p)
                k = 0
                while have - k >= need:
                    rows = t[k : k + need].reshape(B, L)
                    pos = p[k : k + need].reshape(B, L)
                    yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "positions": pos[:, :-1]}
                    k += need
                pend_t, pend_p, have = [t[k:]], [p[k:]], have - k
        epoch += 1


def tokenizer_alone(a: dict) -> Iterator[dict]:
    """What bounds any loader that tokenizes on one thread: only ``encode_batch_fast``
    on texts already in memory (64 per call, the generator's order), no packing. Its
    "batches" are counts of tokens, one per batch's worth."""
    import numpy as np

    docs = JsonlDocs(a["jsonl"])
    texts = [docs.text(int(i)) for i in doc_order(len(docs), a["seed"], 0)]
    tok = load_tokenizer(a["tokenizer"])
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    need = (a["seq_len"] + 1) * a["batch"]
    shape = np.empty((a["batch"], a["seq_len"]), dtype=np.int64)
    have = 0
    while True:
        for c in range(0, len(texts), 64):
            have += sum(len(e.ids) + 1 for e in encode(texts[c : c + 64], add_special_tokens=False))
            while have >= need:
                have -= need
                yield {"input_ids": shape}


def numpy_shuffled_copy(a: dict) -> Iterator[dict]:
    """The floor for pretokenized data in a shuffled document order: per batch, copy the
    documents of a fixed permutation one slice each into [B, L+1] rows (no positions,
    masks, cursors or provenance)."""
    import numpy as np

    tokens = np.asarray(np.load(a["tokens"], mmap_mode="r"))
    offsets = np.load(a["offsets"])
    order = doc_order(len(offsets) - 1, a["seed"], 0)
    starts, ends = offsets[order].tolist(), offsets[order + 1].tolist()
    L, B = a["seq_len"] + 1, a["batch"]
    need = L * B
    pend: list = []
    have = j = 0
    while True:
        while have < need:
            if j == len(starts):
                j = 0
            pend.append(tokens[starts[j] : ends[j]])
            have += ends[j] - starts[j]
            j += 1
        flat = np.concatenate(pend, dtype=np.int64)
        rows = flat[:need].reshape(B, L)
        pend, have = [flat[need:]], have - need
        yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


def numpy_copy(a: dict) -> Iterator[dict]:
    """The raw floor for pretokenized data: copy consecutive [B, L+1] windows out of the memory-mapped tokens."""
    import numpy as np

    tokens = np.load(a["tokens"], mmap_mode="r")
    L, B = a["seq_len"] + 1, a["batch"]
    need = L * B
    pos = 0
    while True:
        if pos + need > len(tokens):
            pos = 0
        rows = np.array(tokens[pos : pos + need], dtype=np.int64).reshape(B, L)
        pos += need
        yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


def _zc_tokens(b) -> int:
    assert b.input_ids.shape == (8, 512), b.input_ids.shape
    return int(b.input_ids.size)


def _dict_tokens(b) -> int:
    x = b["input_ids"]
    assert tuple(x.shape) == (8, 512), x.shape
    return int(x.numel() if hasattr(x, "numel") else x.size)


# ----------------------------------------------------------------------------- P1 / P2 / P6
def case_throughput(a: dict) -> None:
    loader = a["loader"]
    if loader.startswith("zephon_core"):
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401

        import zephon_core  # noqa: F401
    elif loader.startswith("zephon020"):
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
        import zephon  # noqa: F401
    elif loader.startswith("torchdata"):
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import torchdata.stateful_dataloader  # noqa: F401
    elif loader == "grain":
        import grain  # noqa: F401
        import tokenizers  # noqa: F401
    else:
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
    base = rss_mb()
    if loader == "zephon_core":
        p = zc_tokenize_pipeline(a, a["parallelism"], **a.get("options", {}))
        res = run_throughput(lambda: iter(p), _zc_tokens, a)
        res["_it"] = p
    elif loader in ("zephon_core_npy", "zephon_core_megatron"):
        p = zc_pretok_pipeline(a, "npy" if loader.endswith("npy") else "megatron")
        res = run_throughput(lambda: iter(p), _zc_tokens, a)
        res["_it"] = p
    elif loader == "zephon020":
        p = zephon020_pipeline(a, a.get("parallelism"))
        res = run_throughput(lambda: iter(p), zephon020_tokens, a)
        res["_it"] = p
    elif loader == "torchdata":
        dl = torchdata_loader(a, a["num_workers"])
        res = run_throughput(lambda: iter(dl), _dict_tokens, a)
    elif loader == "grain":
        ds = grain_dataset(a)
        res = run_throughput(lambda: iter(ds), grain_tokens, a)
    elif loader == "generator":
        res = run_throughput(lambda: generator(a), _dict_tokens, a)
    elif loader == "numpy_copy":
        res = run_throughput(lambda: numpy_copy(a), _dict_tokens, a)
    elif loader == "numpy_shuffled_copy":
        res = run_throughput(lambda: numpy_shuffled_copy(a), _dict_tokens, a)
    elif loader == "numpy_zephon_order_copy":
        import sources_scale as scale

        res = run_throughput(lambda: scale.numpy_zephon_order_copy(a), _dict_tokens, a)
    elif loader == "tokenizer_alone":
        res = run_throughput(lambda: tokenizer_alone(a), _dict_tokens, a)
    else:
        raise SystemExit(f"unknown loader {loader}")
    finish(res, base)


# ----------------------------------------------------------------------------- P3
def case_restore(a: dict) -> None:
    """Reach an early and a late position, checkpoint, then time restore -> first batch on fresh loaders."""
    import copy
    import statistics

    loader, early, late, reps = a["loader"], a["early"], a["late"], a["reps"]
    out: dict[str, Any] = {"loader": loader, "early_batches": early, "late_batches": late}

    # Per loader: build() -> a fresh loader; start(l) -> its iterator; save(l, it) -> state;
    # restore_first(l, state) -> the first batch after restoring; close(l, it).
    if loader in ("zephon_core", "zephon020"):
        if loader == "zephon_core":
            def build():
                return zc_tokenize_pipeline(a, a.get("parallelism", 1))

            def save(p, it):
                return json.loads(json.dumps(p.checkpoint()))  # as read back from a checkpoint file

            def restore_first(p, st):
                p.restore(st)
                return next(iter(p)), iter(p)

            def size(st):
                return len(json.dumps(st, separators=(",", ":")))
        else:
            import pickle

            def build():
                return zephon020_pipeline(a, a.get("parallelism"))

            def save(p, it):
                return copy.deepcopy(p.checkpoint())

            def restore_first(p, st):
                p.restore(copy.deepcopy(st))
                it = iter(p)
                return next(it), it

            def size(st):
                try:
                    return len(json.dumps(st, separators=(",", ":")))
                except TypeError:
                    return len(pickle.dumps(st))

        def start(p):
            return iter(p)

        def close(p, it):
            getattr(p, "close", lambda: None)()
    elif loader == "torchdata":
        import pickle

        def build():
            return torchdata_loader(a, a["num_workers"])

        def start(dl):
            return iter(dl)

        def save(dl, it):
            return copy.deepcopy(dl.state_dict())

        def restore_first(dl, st):
            dl.load_state_dict(copy.deepcopy(st))
            it = iter(dl)
            return next(it), it

        def close(dl, it):
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()

        def size(st):
            return len(pickle.dumps(st))
    elif loader == "grain":
        def build():
            return grain_dataset(a)

        def start(ds):
            return iter(ds)

        def save(ds, it):
            return copy.deepcopy(it.get_state())

        def restore_first(ds, st):
            it = iter(ds)
            it.set_state(copy.deepcopy(st))
            return next(it), it

        def close(ds, it):
            pass

        def size(st):
            return len(json.dumps(st, separators=(",", ":"), default=str))
    else:
        raise SystemExit(loader)

    # Checkpoints at 5 consecutive batches around each position: a restore's cost depends on
    # where in a chunk the cursor stands, so one checkpoint per position would be noisy.
    spread = a.get("spread", 5)
    t0 = perf()
    p = build()
    it = start(p)
    states: dict[str, list] = {"early": [], "late": []}
    done = 0
    for name, at in (("early", early), ("late", late)):
        for target in range(at - spread + 1, at + 1):
            while done < target:
                next(it)
                done += 1
            states[name].append(save(p, it))
    close(p, it)
    out["reach_s"] = perf() - t0
    out["state_bytes_early"] = size(states["early"][-1])
    out["state_bytes_late"] = size(states["late"][-1])
    times: dict[str, list[float]] = {"early": [], "late": []}
    build_times: list[float] = []
    for _ in range(reps):
        for k in range(spread):
            for name in ("early", "late"):
                st = states[name][k]
                t0 = perf()
                q = build()
                t1 = perf()
                _, qit = restore_first(q, st)
                t2 = perf()
                close(q, qit)
                times[name].append(t2 - t1)
                build_times.append(t1 - t0)
    for name in times:
        out[f"{name}_ms"] = statistics.median(times[name]) * 1e3
        out[f"{name}_p90_ms"] = sorted(times[name])[int(0.9 * (len(times[name]) - 1))] * 1e3
        out[f"{name}_ms_all"] = [t * 1e3 for t in times[name]]
    out["build_ms"] = statistics.median(build_times) * 1e3
    out["late_over_early"] = out["late_ms"] / out["early_ms"]
    out["loadavg"] = os.getloadavg()
    print("RESULT " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- P4
def _agg_rank(base: str, run_id: str, n: int, r: int, state: dict, so: dict, rounds: int, barrier, q) -> None:
    try:
        from zephon_core.checkpoint.aggregate import Aggregator

        agg = Aggregator(base, run_id, n, r, 120.0, so)
        stats: dict[str, list[float]] = {}

        def timed(name: str, fn):
            def wrapper(*args, **kw):
                t = perf()
                try:
                    return fn(*args, **kw)
                finally:
                    st = stats.setdefault(name, [0, 0.0])
                    st[0] += 1
                    st[1] += perf() - t
            return wrapper

        # Trace where a round's time goes (store calls vs sleeping between polls); the
        # wrappers only count and time the calls, they change nothing.
        for name in ("get", "put", "names", "remove", "get_many"):
            setattr(agg.dir, name, timed(name, getattr(agg.dir, name)))
        time.sleep = timed("sleep", time.sleep)
        for k in range(rounds):
            barrier.wait()
            stats.clear()
            t0 = perf()
            merged = agg.checkpoint(state)
            t1 = perf()
            q.put((k, r, t0, t1, len(merged["lanes"]), None, {kk: list(v) for kk, v in stats.items()}))
    except BaseException as e:  # reported, never hangs the parent
        q.put((-1, r, 0.0, 0.0, 0, repr(e), {}))
        barrier.abort()
    finally:
        os._exit(0)


def _store_latency(base: str, so: dict, n: int = 15) -> dict:
    """Median latency of single store calls as the Aggregator makes them (calibration, after the runs)."""
    import statistics

    from zephon_core.checkpoint.folder import AggregateFolder

    d = AggregateFolder(base, "calibration", so)
    payload = json.dumps({"x": "y" * 300}).encode()
    ts: dict[str, list[float]] = {"write (atomic publish)": [], "read": [], "names (list)": [], "remove (1 file)": []}
    for i in range(n):
        for op, fn in (
            ("write (atomic publish)", lambda: d.put(f"f{i}.json", payload)),
            ("read", lambda: d.get(f"f{i}.json")),
            ("names (list)", lambda: d.names()),
            ("remove (1 file)", lambda: d.remove([f"f{i}.json"])),
        ):
            t0 = perf()
            fn()
            ts[op].append(perf() - t0)
    return {op: statistics.median(v) * 1e3 for op, v in ts.items()}


class _S3rver:
    """s3rver (npm; bench/run.sh installs it) on 127.0.0.1:<kernel-chosen port>, objects under ``data_dir``.

    A real S3-compatible server (node, its own process), so the P4 numbers on it measure
    the loader's store calls rather than moto's Python CPU cost. Its only credentials are
    S3RVER / S3RVER; paths are bucket/key (no virtual-host buckets on 127.0.0.1).
    """

    KEY = SECRET = "S3RVER"

    def __init__(self, script: str, data_dir: str, bucket: str, start_timeout: float = 60.0) -> None:
        import re
        import subprocess

        os.makedirs(data_dir, exist_ok=True)
        self.bucket = bucket
        self.log = data_dir.rstrip("/") + "-s3rver.log"  # beside its folder (whose entries are buckets)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["node", script, "--directory", data_dir, "--address", "127.0.0.1", "--port", "0", "--silent", "--configure-bucket", bucket],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        # "S3rver listening on 127.0.0.1:<port>" (printed even with --silent)
        deadline = perf() + start_timeout
        while not (m := re.search(rb"listening on (\S+)\n", open(self.log, "rb").read())) and self.proc.poll() is None and perf() < deadline:
            time.sleep(0.05)
        if not m:
            self.stop()
            raise RuntimeError(f"s3rver did not report its address: {open(self.log, 'rb').read()[-500:]!r}")
        self.endpoint_url = "http://" + m.group(1).decode()

    @property
    def storage_options(self) -> dict:
        return {"key": self.KEY, "secret": self.SECRET, "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"}}

    def url(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def case_aggregate(a: dict) -> None:
    """Aggregation latency with one real (forked) process per rank, for several world sizes.

    ``backend``: ``local`` (a folder, ``local_dir``), ``s3`` (moto's server, the tests' one)
    or ``s3rver`` (the node server at ``s3rver``, objects under ``local_dir``).
    """
    import multiprocessing as mp
    import statistics
    import uuid

    import numpy as np

    from zephon_core import MemorySource, Pipeline, StaticMixture
    from zephon_core.checkpoint.aggregate import Aggregator  # noqa: F401  (imported before fork)

    backend = a["backend"]
    server = None
    so: dict = {}
    if backend == "s3":
        import s3fs  # noqa: F401

        sys.path.insert(0, str(ROOT / "tests"))
        from support.s3_server import S3Server

        server = S3Server(bucket="zephon-bench", mode="process")
        ep = server.start()
        so = ep.storage_options
        base = ep.url("aggregate")
    elif backend == "s3rver":
        import s3fs  # noqa: F401

        server = _S3rver(a["s3rver"], a["local_dir"], bucket="zephon-bench")
        so = server.storage_options
        base = server.url("aggregate")
    else:
        base = a["local_dir"]
        os.makedirs(base, exist_ok=True)
    src = MemorySource([np.arange(40) + i for i in range(256)])
    out: dict[str, Any] = {"backend": backend, "per_ranks": {}}
    try:
        for n in a["ranks"]:
            run_id = f"bench-{n}-{uuid.uuid4().hex[:8]}"
            proto = Pipeline(StaticMixture([src], seed=1, chunk_size=4)).pack(32).batch(2)
            states = [
                proto.options(world_size=n, global_rank=r, canonical_replicas=n, aggregate_dir=base, run_id=run_id).local_state()
                for r in range(n)
            ]
            ctx = mp.get_context("fork")
            rounds = a["rounds"]
            barrier = ctx.Barrier(n + 1)
            q = ctx.SimpleQueue()
            procs = [ctx.Process(target=_agg_rank, args=(base, run_id, n, r, states[r], so, rounds, barrier, q), daemon=True) for r in range(n)]
            t_spawn = perf()
            for pr in procs:
                pr.start()
            rows: list[list[tuple]] = [[] for _ in range(rounds)]
            errors: list[str] = []
            for _k in range(rounds):
                try:
                    barrier.wait(timeout=180)
                except Exception:
                    errors.append("barrier broken")
                    break
                got = 0
                while got < n:
                    item = q.get()
                    if item[5] is not None:
                        errors.append(f"rank {item[1]}: {item[5]}")
                        break
                    rows[item[0]].append(item)
                    got += 1
                if errors:
                    break
            for pr in procs:
                pr.join(timeout=30)
            res: dict[str, Any] = {"spawn_s": perf() - t_spawn, "errors": errors}
            if not errors:
                lat = [max(r[3] for r in rs) - min(r[2] for r in rs) for rs in rows]
                leader = [next(r for r in rs if r[1] == 0) for rs in rows]
                def trace(rs: list[tuple], leader: bool) -> dict:
                    sel = [x[6] for x in rs if (x[1] == 0) == leader]
                    out_t = {}
                    for op in sorted({op for d in sel for op in d}):
                        out_t[op] = {"calls": sum(d.get(op, [0, 0])[0] for d in sel) / len(sel), "ms": sum(d.get(op, [0, 0])[1] for d in sel) / len(sel) * 1e3}
                    return out_t

                last = rows[-1]
                res.update(
                    trace_last_round={"leader": trace(last, True), "follower_mean": trace(last, False) if n > 1 else {}},
                    first_round_ms=lat[0] * 1e3,
                    warm_ms=statistics.median(lat[1:]) * 1e3 if len(lat) > 1 else lat[0] * 1e3,
                    rounds_ms=[x * 1e3 for x in lat],
                    leader_warm_ms=statistics.median([(r[3] - r[2]) for r in leader[1:]]) * 1e3 if len(leader) > 1 else None,
                    merged_lanes=rows[0][0][4],
                )
            out["per_ranks"][str(n)] = res
            print(f"# {backend} ranks={n}: {res.get('warm_ms', errors)}", file=sys.stderr, flush=True)
        out["store_latency_ms"] = _store_latency(base, so)
    finally:
        if server is not None:
            server.stop()
    out["loadavg"] = os.getloadavg()
    print("RESULT " + json.dumps(out), flush=True)


def case_aggregate_scale(a: dict) -> None:
    """bench/aggregate_scale.py with the command-line arguments ``a["argv"]``: simulated ranks at cluster scale."""
    sys.path.insert(0, str(ROOT / "bench"))
    import aggregate_scale

    print("RESULT " + json.dumps(aggregate_scale.run(aggregate_scale.parse(a["argv"]))), flush=True)


# ----------------------------------------------------------------------------- P9
def case_stats_overhead(a: dict) -> None:
    """bench/stats_overhead.py: the pipelines of P1 and P2 with and without the accounting ``Pipeline.stats()`` reads."""
    sys.path.insert(0, str(ROOT / "bench"))
    import stats_overhead

    print("RESULT " + json.dumps(stats_overhead.run(Path(a["work"]), a["rounds"], a["seconds"])), flush=True)


# ----------------------------------------------------------------------------- P5
def case_state_bytes(a: dict) -> None:
    """Checkpoint JSON bytes as a function of canonical_replicas (lanes)."""
    from zephon_core.checkpoint.state import canonical_json

    out: dict[str, Any] = {"by_lanes": {}}
    for C in a["lanes"]:
        p = zc_pretok_pipeline(a, "npy", canonical_replicas=C, prefetch=0)
        it = iter(p)
        for _ in range(3 * C):
            next(it)
        st = p.checkpoint()
        t0 = perf()
        for _ in range(10):
            p.checkpoint()
        out.setdefault("checkpoint_call_ms_pretok", {})[str(C)] = (perf() - t0) / 10 * 1e3
        p.close()
        lanes_part = len(canonical_json(st["lanes"]))
        out["by_lanes"][str(C)] = {"total": len(canonical_json(st)), "lanes_json": lanes_part, "example_lane": st["lanes"][str(C - 1)]}
    Cs = sorted(int(c) for c in out["by_lanes"])
    lo, hi = out["by_lanes"][str(Cs[0])], out["by_lanes"][str(Cs[-1])]
    out["marginal_bytes_per_lane"] = (hi["total"] - lo["total"]) / (Cs[-1] - Cs[0])
    out["total_over_lanes_at_max"] = hi["total"] / Cs[-1]
    # The tokenize pipeline (P1 definition): its fixed part (definition + fingerprint), and
    # what one checkpoint() call costs (world_size 1: no aggregation, just building the state).
    import statistics

    p = zc_tokenize_pipeline(a, 1, canonical_replicas=8, prefetch=0)
    it = iter(p)
    for _ in range(8):
        next(it)
    st = p.checkpoint()
    ts = []
    for _ in range(20):
        t0 = perf()
        p.checkpoint()
        ts.append(perf() - t0)
    out["checkpoint_call_ms_tokenize"] = statistics.median(ts) * 1e3
    from zephon_core.lane.ops import tokenizer_identity

    tok = load_tokenizer(a["tokenizer"])
    ts = []
    for _ in range(20):
        t0 = perf()
        tokenizer_identity(tok)
        ts.append(perf() - t0)
    out["tokenizer_identity_ms"] = statistics.median(ts) * 1e3
    out["tokenizer_json_bytes"] = len(tok.to_str())
    p.close()
    out["tokenize_pipeline_C8_total"] = len(canonical_json(st))
    out["tokenize_pipeline_definition"] = len(canonical_json(st["definition"]))
    # A far-future lane: every cursor field at 10^9 (digits grow with progress), and its tally of one
    # source: 10^9 batches of 8 rows, 10^13 tokens (a lane's share of a very long run)
    far_tally = {"since": 0, "rows": 8 * 10**9, "padding": 10**9, "cut": 10**10, "tokens": [[10**13]], "documents": [[10**10]]}
    far = {"cursor": [10**9, 10**6, 10**6, 10**4], "delivered": 10**9, "tally": far_tally}
    out["far_lane_bytes"] = len(canonical_json({"63": far})) - 2 + 1  # entry plus its comma
    print("RESULT " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- profiling targets
def case_profile_target(a: dict) -> None:
    """Workload for run.py's profile stage: set up, print READY, wait for a line on stdin
    (py-spy attaches meanwhile), run the measured part, exit."""
    what = a["what"]

    def ready() -> None:
        print("READY", flush=True)
        sys.stdin.readline()

    t0 = 0.0
    if what in ("p1", "p1_sync"):
        opts = {"prefetch": 0, "reader_threads": 0} if what == "p1_sync" else {}
        p = zc_tokenize_pipeline(a, 1, **opts)
        it = iter(p)
        for _ in range(3):
            next(it)
        ready()
        t0 = perf()
        for _ in range(a["batches"]):
            next(it)
        p.close()
        note = f"{a['batches'] / (perf() - t0):.1f} batches/s under the profiler"
    elif what == "p2":
        p = zc_pretok_pipeline(a, "megatron")
        it = iter(p)
        for _ in range(10):
            next(it)
        ready()
        t0 = perf()
        for _ in range(a["batches"]):
            next(it)
        p.close()
        note = f"{a['batches'] / (perf() - t0):.1f} batches/s under the profiler"
    elif what == "p3":
        p = zc_tokenize_pipeline(a, 1)
        it = iter(p)
        for _ in range(a["late"]):
            next(it)
        st = json.loads(json.dumps(p.checkpoint()))
        p.close()
        ready()
        t0 = perf()
        for _ in range(a["reps"]):
            q = zc_tokenize_pipeline(a, 1)
            q.restore(st)
            next(iter(q))
            q.close()
        note = f"restore -> first batch: {(perf() - t0) / a['reps'] * 1e3:.1f} ms each (pipeline build included) under the profiler"
    else:
        raise SystemExit(what)
    print("RESULT " + json.dumps({"note": note}), flush=True)


def case_digests(a: dict) -> None:
    """Content digests of batches, with provenance and cursors, for five pipelines (each across a
    restore). run.py runs this with several execution options (``a["options"]``: prefetch,
    readahead, reader_threads, which must never change the data) and compares the digests, also
    with those an earlier run recorded."""
    import hashlib

    from zephon_core import MegatronIndexedSource, Pipeline, StaticMixture, TokenArraySource

    def digest_run(make, n, restore_at=None):
        h = hashlib.sha256()
        p = make()
        it = iter(p)
        for k in range(n):
            b = next(it)
            h.update(b.digest.encode())
            h.update(repr((b.lane, b.lane_index, tuple(b.cursor), b.provenance)).encode())
            if restore_at == k:
                st = json.loads(json.dumps(p.checkpoint()))
                p.close()
                p = make()
                p.restore(st)
                it = iter(p)
        p.close()
        return h.hexdigest()[:16]

    tok = load_tokenizer(a["tokenizer"])
    opts = a.get("options", {})
    from zephon_core import JsonlSource

    def tokenize(par, C=None, dp=(1, 0), chunk=64, shuffle=None):
        def make():
            p = Pipeline(StaticMixture([JsonlSource(a["jsonl"], cache_dir=a["index_cache"])], seed=3, chunk_size=chunk)).tokenize(tok, eos_id=EOS, parallelism=par).pack(128)
            if shuffle:
                p = p.shuffle(shuffle)
            return p.batch(4).options(canonical_replicas=C or dp[0], dp_degree=dp[0], dp_group_id=dp[1], **opts)
        return make

    def pretok(kind, C=1, exhausted="repeat", mode="concat", weights=None):
        def make():
            srcs = [TokenArraySource(a["tokens"], a["offsets"]), MegatronIndexedSource(a["megatron"])] if kind == "mix" else [
                TokenArraySource(a["tokens"], a["offsets"]) if kind == "npy" else MegatronIndexedSource(a["megatron"])]
            return Pipeline(StaticMixture(srcs, weights=weights, seed=5, chunk_size=16, exhausted=exhausted)).pack(256, mode=mode).shuffle(8).batch(2).options(canonical_replicas=C, **opts)
        return make

    out = {
        "tokenize p1": digest_run(tokenize(1), 40, restore_at=17),
        "tokenize p2 C4 dp2/1 shuffle": digest_run(tokenize(2, C=4, dp=(2, 1), chunk=16, shuffle=4), 40, restore_at=9),
        "pretok npy C8 pad": digest_run(pretok("npy", C=8, mode="pad"), 300, restore_at=131),
        "pretok mix 3:1 stop": digest_run(pretok("mix", C=2, exhausted="stop", weights=[3, 1]), 400, restore_at=201),
        "pretok megatron C1": digest_run(pretok("megatron"), 3000, restore_at=1500),
    }
    print("RESULT " + json.dumps(out), flush=True)


def case_prepare(a: dict) -> None:
    """Build the corpus (cached) and zephon_core's JSONL index cache."""
    sys.path.insert(0, str(ROOT / "bench"))
    import corpus

    work = Path(a["work"])
    meta = corpus.build(work, n_docs=a["docs"], n_pretok=a["docs"], seed=a["seed"], log=lambda m: print("# " + m, file=sys.stderr, flush=True))
    paths = corpus.paths(work, meta)
    from zephon_core import JsonlSource

    JsonlSource(paths["jsonl"], cache_dir=a["index_cache"])
    print("RESULT " + json.dumps({"meta": meta, "paths": paths}), flush=True)


def case_versions(a: dict) -> None:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in a["packages"]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    print("RESULT " + json.dumps(out), flush=True)


CASES = {
    "throughput": case_throughput,
    "restore": case_restore,
    "aggregate": case_aggregate,
    "aggregate_scale": case_aggregate_scale,
    "state_bytes": case_state_bytes,
    "stats_overhead": case_stats_overhead,
    "profile_target": case_profile_target,
    "prepare": case_prepare,
    "digests": case_digests,
    "startup": lambda a: __import__("sources_scale").main("startup", a),
    "s3_reads": lambda a: __import__("sources_scale").main("s3_reads", a),
    "versions": case_versions,
}

if __name__ == "__main__":
    CASES[sys.argv[1]](json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
