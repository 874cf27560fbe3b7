"""Resuming from a damaged merged state: truncated files, flipped bytes,
corrupt files in the aggregation folder. A damaged state is refused with a
message naming the file or field; an intact one resumes with 0 samples lost
or duplicated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import relkit
from relkit import C, M, by_step, compare, reference

from zephon_core import AggregationError, StateError, ZephonError
from zephon_core.checkpoint.records import decode_round, encode_part
from zephon_core.checkpoint.state import checksum_of
from zephon_core.integration.state_readers import StateReadError, load_state
from zephon_core.verify.simulate import Phase, run_phase

STEPS = 3


def _group(G: int, g: int):
    return relkit.pipeline(dp_degree=G, dp_group_id=g, prefetch=0)


def run(G: int, steps: int, state: dict | None = None) -> tuple[list, dict]:
    """``steps`` optimizer steps on ``G`` groups (the simulation's phase), from ``state``: every batch's record (as
    relkit.batch_record) and the merged state, as loaded from a file."""
    rows: list = []

    def record(_: int, batch) -> None:
        rows.append(relkit.batch_record(batch))

    _, merged = run_phase(_group, Phase(G, steps), C * M, state, on_batch=record)
    return rows, json.loads(json.dumps(merged))


def merged_state(steps: int = STEPS) -> dict:
    """A merged state of two groups after ``steps`` optimizer steps."""
    return run(2, steps)[1]


def resume_rows(state: dict, steps: int, G: int = 2) -> list:
    return run(G, steps, state)[0]


def test_intact_merged_file_resumes_without_loss(tmp_path, rel):
    before, state = run(2, STEPS)  # the rows of the first STEPS steps, as the first run delivered them
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(state))
    loaded = load_state(str(path))
    after = resume_rows(loaded, 3, G=4)  # resumed on 4 groups
    checked, lost, dup = compare(by_step(before + after), reference(STEPS + 3))
    rel.case("intact merged file (2 groups), resumed on 4 groups", "0 lost, 0 duplicated", samples=checked, lost=lost, duplicated=dup)
    assert (lost, dup) == (0, 0)


def test_truncated_merged_file_is_refused(tmp_path, rel):
    data = json.dumps(merged_state(), sort_keys=True, separators=(",", ":")).encode()
    path = tmp_path / "merged.json"
    bad = []
    cuts = list(range(0, len(data)))
    for cut in cuts:
        path.write_bytes(data[:cut])
        try:
            state = load_state(str(path))
        except StateReadError as e:
            if str(path) not in str(e):
                bad.append((cut, str(e)))
            continue
        try:  # valid JSON after all (cannot happen for a JSON object): restore must refuse it
            relkit.pipeline(prefetch=0).restore(state)
            bad.append((cut, "accepted"))
        except StateError:
            pass
    rel.case(f"merged file truncated at each of {len(cuts)} lengths", "refused at every length, naming the file" if not bad else f"FAILED {bad[:3]}")
    assert not bad, bad[:5]


def _classify(original: dict, data: bytes, path: Path, target) -> str:
    """What happens when the damaged bytes are loaded and restored into ``target``."""
    path.write_bytes(data)
    try:
        state = load_state(str(path))
    except StateReadError as e:
        return "refused: not JSON" if str(path) in str(e) else f"UNCLEAR: {e}"
    try:
        target.restore(state)  # validates only: the pipeline is never iterated
    except StateError:
        return "refused: StateError"
    except ZephonError as e:
        return f"refused: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001
        return f"UNCLEAR: {type(e).__name__}: {e}"
    if state == original:
        return "same state"
    if {k: v for k, v in state.items() if k != "topology"} == {k: v for k, v in original.items() if k != "topology"}:
        return "topology only (informational)"
    return "SILENT: accepted a different state"


def test_flipped_bytes_in_a_merged_file(tmp_path, rel):
    """Flip one bit (the lowest) of every byte of a merged state file in turn.

    A flip in the definition is caught by the fingerprint and most others make
    the file invalid JSON. A flip that turns a lane's digit into another digit
    keeps the file valid and the state well-formed; nothing in the state covers
    the lanes, so restore accepts another position: samples would be lost or
    repeated. This test counts every outcome and fails on any silent one.
    """
    original = merged_state()
    data = json.dumps(original, sort_keys=True, separators=(",", ":")).encode()
    path = tmp_path / "merged.json"
    outcomes: dict[str, list[int]] = {}
    target = relkit.pipeline(prefetch=0)
    for pos in range(len(data)):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        outcomes.setdefault(_classify(original, bytes(flipped), path, target), []).append(pos)
    silent = outcomes.get("SILENT: accepted a different state", [])
    unclear = {k: v for k, v in outcomes.items() if k.startswith("UNCLEAR")}
    summary = ", ".join(f"{k}: {len(v)}" for k, v in sorted(outcomes.items()))
    rel.case(f"1-bit flips at each of {len(data)} bytes ({summary})", "every flip refused (StateError or not JSON); none restored" if not silent and not unclear else "FAILED")
    assert not unclear, unclear
    examples = [data[max(0, p - 25) : p + 10].decode() + f"  <- byte {p}" for p in silent[:3]]
    assert not silent, f"{len(silent)} one-bit flips were restored as a different state, e.g.\n" + "\n".join(examples)


def test_resume_from_a_silently_altered_lane_loses_samples(rel):
    """What an undetected flip costs: a lane's chunk 0 -> 1 in a merged state
    restores without complaint and skips that lane's data (measured)."""
    state = merged_state()
    altered = json.loads(json.dumps(state))
    altered["lanes"]["2"]["cursor"][0] += 1  # '0' -> '1' is a one-bit flip
    try:
        rows = resume_rows(altered, 2)
    except StateError:
        rel.case("lane cursor altered by one bit ('0' -> '1')", "refused with a StateError (checksum)")
        return
    good = resume_rows(state, 2)
    _, lost, dup = compare(by_step(rows), by_step(good))
    rel.case("lane cursor altered by one bit", "FAILED: restored silently", samples=sum(len(r["rows"]) for r in good), lost=lost, duplicated=dup)
    raise AssertionError(f"restored silently: {lost} rows lost and {dup} rows not in the uninterrupted run")


def _leader_with_fake_follower(tmp_path: Path, follower_bytes, expect: type[Exception] = AggregationError) -> str:
    """A real leader (thread) and a follower that writes ``follower_bytes(round)`` as its part file.

    A file with no part of this round in it may be a crashed writer's leftover: the leader
    waits for its timeout (short here) and then names it; one with this round's token but
    wrong content is refused at once."""
    agg = tmp_path / "agg"
    leader = relkit.pipeline(world_size=2, global_rank=0, dp_degree=2, dp_group_id=0, aggregate_dir=str(agg), run_id="job",
                             aggregate_timeout_s=3, prefetch=0)
    t, out = relkit.checkpoint_in_thread(leader)
    round_file = agg / "job" / "round.json"
    relkit.wait_for(round_file.exists, 30, "the leader's round")
    rf = decode_round(round_file.read_bytes(), 2)
    assert rf is not None and rf.open
    target = agg / "job" / "part-1.json"
    tmp = target.with_name(".tmp-fake")
    tmp.write_bytes(follower_bytes(rf.round))
    tmp.replace(target)
    t.join(60)
    assert not t.is_alive()
    leader.close()
    assert "error" in out, f"the leader accepted {target.name}: {out.get('state')}"
    assert isinstance(out["error"], expect), repr(out["error"])
    msg = str(out["error"])
    assert target.name in msg, msg
    return msg


@pytest.mark.parametrize("damage", ["truncated", "not JSON", "pickle bytes", "wrong rank", "other world size", "a bare state"])
def test_leader_refuses_a_damaged_follower_file(tmp_path, rel, damage):
    follower = relkit.pipeline(world_size=2, global_rank=1, dp_degree=2, dp_group_id=1, aggregate_dir=str(tmp_path / "unused"),
                               run_id="job", prefetch=0)
    st = follower.local_state()
    follower.close()

    def payload(rnd) -> bytes:
        good = encode_part(rnd, 0, 1, st, {"groups": 2, "candidates": [1]})
        if damage == "truncated":
            return good[:-40]
        if damage == "not JSON":
            return b"\x00\x01garbage"
        if damage == "pickle bytes":
            return b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06getpid\x94\x93\x94)R\x94."
        if damage == "a bare state":
            return json.dumps(st).encode()
        topo = {"wrong rank": {"global_rank": 0}, "other world size": {"world_size": 4}}[damage]
        forged = {**st, "topology": {**st["topology"], **topo}}
        forged["checksum"] = checksum_of(forged)  # a well-formed state, of the wrong rank or run
        return encode_part(rnd, 0, 1, forged, {"groups": 2, "candidates": [1]})

    msg = _leader_with_fake_follower(tmp_path, payload)
    rel.case(f"follower state file: {damage}", "AggregationError naming the file")
    assert len(msg) < 800
