"""P10: the formats a corpus is already in (docs/formats.md): each ``format_*.py`` of this package measures Zephon's
source through a pipeline beside the peer library that owns the format, on the same documents in the same process.

Each script prints one ``RESULT {json}`` line in its own shape; ``SIDES`` reads, per format, the figures this
goal compares: start-up seconds, documents/s and tokens/s of each side, and start-up over many shards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from goal import Script, Target, script_goal, verdict
from harness import fmt

HERE = "bench/goals/p10_formats"
# New with P10 (no earlier target): Zephon's source delivers tokens at least as fast as the format's own reader.
TARGETS = {"P10_tokens_vs_peer": 1.0}


def _side(x: dict, startup: str = "startup_s", tokens: str = "tokens_per_s", docs: str | None = "docs_per_s") -> dict:
    return {"startup_s": x.get(startup), "tokens_per_s": x.get(tokens), "docs_per_s": x.get(docs) if docs else None}


def _webdataset(r: dict) -> dict:
    m = r.get("many_shards", {})
    return {"zephon": _side(r["zephon"]), "peer": _side(r["webdataset"]),
            "many": (m.get("shards"), m.get("zephon_startup_s"), m.get("webdataset_first_sample_s"))}


def _mds(r: dict, kind: str) -> dict:
    m = r.get("startup_at_shards", {})
    return {"zephon": _side(r["rows"][f"zephon_{kind}"]), "peer": _side(r["rows"][f"streaming_{kind}"]),
            "many": (m.get("shards"), m.get("zephon_source_s"), m.get("streaming_dataset_s"))}


def _arrow(r: dict) -> dict:
    z, d, m = r["zephon"], r["datasets"], r.get("many_shards", {})
    return {"zephon": {**_side(z, tokens="pipeline_tokens_per_s", docs=None),
                       "docs_per_s": z.get("sequential", {}).get("docs_per_s")},
            "peer": {**_side(d, tokens="tokenize_tokens_per_s", docs=None),
                     "docs_per_s": d.get("sequential", {}).get("docs_per_s")},
            "many": (m.get("shards"), m.get("zephon_manifest_startup_s"), m.get("datasets_load_from_disk_s"))}


def _megatron_s3(r: dict) -> dict:
    m = r.get("many", {})
    return {"zephon": _side(r, "startup_no_manifest_s", "s3_blocks_tokens_per_s", None),
            "peer": _side(r, "peer_startup_s", "peer_s3_blocks_tokens_per_s", None),
            "many": (m.get("prefixes"), m.get("manifest_startup_s"), None)}


# Row name -> (the script's name in R["P10"], Zephon's source, the peer, how to read the script's RESULT).
SIDES: dict[str, tuple[str, str, str, Callable[[dict], dict]]] = {
    "webdataset": ("webdataset", "WebDatasetSource", "webdataset 1.0 (WebDataset)", _webdataset),
    "mds text": ("mds", "MdsSource", "streaming (StreamingDataset)", lambda r: _mds(r, "text")),
    "mds tokens": ("mds", "MdsTokensSource", "streaming (StreamingDataset)", lambda r: _mds(r, "tokens")),
    "arrow": ("arrow", "ArrowSource", "datasets (load_from_disk)", _arrow),
    "megatron on s3 (20 ms, block order)": ("megatron_s3", "MegatronIndexedSource", "megatron-core (IndexedDataset)",
                                            _megatron_s3),
}
SCRIPTS = {name: Script(f"{HERE}/format_{name}.py", timeout=1800)
           for name in ("webdataset", "mds", "arrow", "megatron_s3")}


def sides(R: dict) -> dict[str, dict]:
    """Every row whose script gave a result: name -> {"zephon", "peer", "many", "ratio"}."""
    out = {}
    for name, (script, _, _, read) in SIDES.items():
        res = R.get("P10", {}).get(script)
        if not res or "error" in res:
            continue
        s: dict[str, Any] = read(res)
        zt, pt = s["zephon"]["tokens_per_s"], s["peer"]["tokens_per_s"]
        s["ratio"] = zt / pt if zt and pt else None
        out[name] = s
    return out


def verdicts(R: dict) -> list[dict]:
    rows = []
    for name, s in sides(R).items():
        v, z, p = s["ratio"], s["zephon"], s["peer"]
        if v is None:
            continue
        shown = (f"{v:.2f}x (start-up {fmt(z['startup_s'], '.2f')} s vs {fmt(p['startup_s'], '.2f')} s)")
        rows.append(verdict(f"P10 {name}: {SIDES[name][1]} vs {SIDES[name][2]} (tokens/s)",
                            Target(">=", TARGETS["P10_tokens_vs_peer"], "x"), v, shown))
    return rows


def _k(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 1e3:,.0f} k"


def section(R: dict, B: dict) -> list[str]:
    if "P10" not in R:
        return []
    L = [f"## P10 formats: Zephon's source beside the format's own reader ({HERE}/format_*.py, same documents, "
         "same process)\n",
         "| format | Zephon | peer | start-up s (Zephon / peer) | docs/s (Zephon / peer) | tokens/s (Zephon / peer) "
         "| x peer tokens/s | start-up at N shards: N, Zephon s / peer s |",
         "|---|---|---|---|---|---|---|---|"]
    for name, s in sides(R).items():
        z, p, (n, zm, pm) = s["zephon"], s["peer"], s["many"]
        L.append(f"| {name} | {SIDES[name][1]} | {SIDES[name][2]} | {fmt(z['startup_s'], '.2f')} / "
                 f"{fmt(p['startup_s'], '.2f')} | {_k(z['docs_per_s'])} / {_k(p['docs_per_s'])} | "
                 f"{_k(z['tokens_per_s'])} / {_k(p['tokens_per_s'])} | {fmt(s['ratio'], '.2f')} | "
                 f"{n if n is not None else 'n/a'}: {fmt(zm, '.2f')} / {fmt(pm, '.2f')} |")
    for script, res in R["P10"].items():
        if "error" in res:
            L.append(f"\n{HERE}/format_{script}.py: {res['error']}.")
    L.append("\nStart-up: the source ready (no manifest) vs the peer ready; arrow's tokens/s: the pipeline's packed "
             "tokens vs datasets' batches tokenized; megatron on s3: through a proxy adding 20 ms per request, the "
             "many-prefix start-up with a manifest. The scripts' every field is in results.json (`P10`).\n")
    return L


GOAL = script_goal("P10", "formats: Zephon's sources beside the formats' own readers", SCRIPTS, TARGETS, verdicts,
                   section)
