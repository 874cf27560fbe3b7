"""What the ODM-steered launches (TorchTitan's and Megatron's, tests/e2e) share: a recipe steered by ODM on the
model's own per-source losses, the offline replay of the controller from a checkpoint's steering clock, the data
by replay of a final state (journal and surgery), and a document to quarantine that the resumed run would train on.

A run steered by real losses is not bit-reproducible across data-parallel degrees (float reductions differ), so
the reference of a resumed run's decisions is the controller itself, replayed here from the clock over the figures
each decision journaled; the reference of its data is the recipe with its final state's journal replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from zephon_core.checkpoint.steering import Clock
from zephon_core.checkpoint.surgery import SurgeryJournal, surgery_journal_of
from zephon_core.curriculum.controllers import MixingInputs, bounded
from zephon_core.curriculum.journal import DENOMINATOR, MixingJournal, quantize
from zephon_core.pipeline.builder import Pipeline
from zephon_core.pipeline.mixing import Mixing, replay

#: Two sources: ODM's exploration rate is 1/K (uniform shares, nothing journaled) while t <= K ln K, so with two
#: its second ask already moves the mix; alpha 0.5 lets the losses show in a few intervals.
NAMES = ("examples", "prose")
INTERVAL = 2
ODM = f'[mixing]\ncontroller = "odm"\nalpha = 0.5\ninterval_steps = {INTERVAL}\nmin_share = 0.1\nmax_change = 0.2\n'


def odm_recipe(root: Path, name: str, *, lanes: int, head: str = "", surgery: str = "") -> Path:
    """``root/<name>.toml``: ``NAMES``' token arrays in ``root`` (``token_corpora``) mixed 1:1 on ``lanes`` lanes,
    steered by ODM every ``INTERVAL`` steps, with ``surgery`` (a ``[surgery]`` table's body) when given."""
    sources = "".join(f'[[sources]]\nname = "{n}"\npath = "{n}.npy"\nformat = "token_array"\n'
                      f'offsets = "{n}_offsets.npy"\nweight = 1.0\n\n' for n in NAMES)
    recipe = root / f"{name}.toml"
    recipe.write_text(f"seed = 11\nchunk_size = 4\ncanonical_replicas = {lanes}\n{head}\n[shuffle]\nwindow = 4\n"
                      f"seed = 2\n\n{sources}{ODM}" + (f"\n[surgery]\n{surgery}" if surgery else ""))
    return recipe


def check_odm_resume(mixing: Mixing, clock: Clock | None,
                     at_checkpoint: MixingJournal | None, final: MixingJournal | None,
                     trained: Callable[[int, int], int], tokens_per_step: int) -> list[int]:
    """A resumed ODM run's journal ``final`` against its checkpoint's journal ``at_checkpoint`` and steering
    ``clock``; returns the steps of the decisions the resumed run made.

    ``final`` extends ``at_checkpoint`` unchanged; the first decision after the resume is at the step the
    uninterrupted schedule of asks implies (``clock.asked_at + INTERVAL``) and the next ones ``INTERVAL`` apart
    (every ask moved the mix, so nothing unjournaled lies between); each journals the loss tokens of the steps its
    interval trained (``trained(after, upto)`` of them, the clock's steps included); and each is the decision
    ``mixing``'s controller makes offline, continued from the clock (then from the state the decision before it
    journaled), fed the decision's journaled figures: the same quantized weights, the same state after it."""
    assert clock is not None and clock.controller == "odm", clock
    assert at_checkpoint is not None and at_checkpoint.decisions, "no decision journaled before the checkpoint"
    assert final is not None and final.decisions[:len(at_checkpoint.decisions)] == at_checkpoint.decisions
    made = final.decisions[len(at_checkpoint.decisions):]
    assert made, "no decision journaled after the resume"
    assert [d.step for d in made] == list(range(clock.asked_at + INTERVAL, made[-1].step + 1, INTERVAL))
    ctrl = mixing.controller
    shares = tuple(at_checkpoint.decisions[-1].weights[n] / DENOMINATOR for n in NAMES)
    asked, state = clock.asked_at, clock.state
    for d in made:
        tokens = tuple(d.figures["loss_tokens"][n] for n in NAMES)
        assert sum(tokens) == trained(asked, d.step) * tokens_per_step, (d.step, tokens)
        if asked == clock.asked_at:  # the interval under way at the checkpoint: its losses came from the clock
            assert all(t >= c for t, c in zip(tokens, clock.loss_tokens)) and sum(clock.loss_tokens) > 0
        means = [d.figures["mean_loss"][n] for n in NAMES]
        inputs = MixingInputs(d.step, NAMES, tuple(0.0 if m is None else m * t for m, t in zip(means, tokens)),
                              tokens, (0,) * len(NAMES), shares)
        ctrl.load_state(state)
        proposal = ctrl.propose(inputs)
        assert proposal is not None
        weights = quantize(bounded(shares, proposal, mixing.min_share, mixing.max_change))
        # The journal keeps each mean loss to 6 significant digits: recomputed from them, a share on a rounding
        # edge of 1/10,000 may come out one unit off; the run's own weights go on from there.
        assert all(abs(w - d.weights[n]) <= 1 for n, w in zip(NAMES, weights)), (d.step, weights, d.weights)
        offline = ctrl.state()
        assert offline["t"] == d.state["t"] and offline["eps_prev"] == d.state["eps_prev"]
        assert offline["rewards"] == pytest.approx(d.state["rewards"], rel=1e-5), (d.step, offline, d.state)
        shares, asked, state = tuple(d.weights[n] / DENOMINATOR for n in NAMES), d.step, d.state
    return [d.step for d in made]


@dataclass
class Replayed:
    """The data by replay, per global step: ``digests[step][(lane, lane_index)]`` and the documents its rows hold
    (``documents[step]``: (source number, document number))."""

    digests: dict[int, dict[tuple[int, int], str]]
    documents: dict[int, set[tuple[int, int]]]


def replayed(make: Callable[[], Pipeline], state: Mapping[str, Any], batches: int, step_of: Callable[[int], int],
             surgery: SurgeryJournal | None = None, restore: bool = False) -> Replayed:
    """The first ``batches`` batches of the recipe (``make()``: on one group, all lanes) with ``state``'s mixing
    journal replayed and its surgery journal applied (``surgery``: another), as ``zephon ledger --replay`` does;
    ``restore``: from ``state``'s position on (the batches a resume delivers), else from the start."""
    p = replay(make(), state)
    if restore:
        p.restore(state)
    p.surgery = surgery_journal_of(state) if surgery is None else surgery
    out = Replayed({}, {})
    with p:
        for _, b in zip(range(batches), p):
            step = step_of(b.lane_index)
            out.digests.setdefault(step, {})[(b.lane, b.lane_index)] = b.digest
            seg = b.segments[b.segments[:, 4] > b.segments[:, 3]]
            out.documents.setdefault(step, set()).update(zip(seg[:, 1].tolist(), seg[:, 2].tolist()))
    return out


def document_to_quarantine(make: Callable[[], Pipeline], state: Mapping[str, Any], per_step: int) -> tuple[str, int]:
    """A document (source name, number) the run resumed from ``state`` trains on whatever its next decision (made
    after the step after ``state``'s) decides, and that a quarantine journaled at ``state`` leaves out: one of a
    chunk at or past its lane's quarantine start (the first chunk the lane had not begun to read) and before the
    read frontier after the next step (the least chunk that decision may start at), which the recipe with
    ``state``'s journal delivers within three steps. Its absence from the resumed run is the quarantine's doing."""
    def restored() -> Pipeline:
        p = replay(make(), state)
        p.restore(state)
        return p

    with restored() as probe:
        probe.quarantine([(NAMES[0], 0)])  # any document: where a quarantine journaled at the state starts
        starts = probe.surgery.quarantines[-1].from_chunks
    with restored() as p:
        for _ in zip(range(per_step), p):
            pass
        least = p.read_frontier()
    with restored() as p:
        segments = [b.segments for _, b in zip(range(3 * per_step), p)]
        ahead = {(int(s), int(d)) for seg in segments for s, d in seg[seg[:, 4] > seg[:, 3]][:, 1:3]}
        C = len(starts)
        for g in range(min(lane + C * k for lane, k in enumerate(starts)), least):
            chunk = p.work_source.chunk(g) if g >= g % C + C * starts[g % C] else None
            for source, doc in zip(chunk.sources.tolist(), chunk.documents.tolist()) if chunk is not None else ():
                if (source, doc) in ahead:
                    return NAMES[source], doc
    raise AssertionError(f"no chunk between the quarantine starts {starts} and the read frontier {least}")


def steps_holding(table: Any, document: tuple[str, int]) -> list[int]:
    """The steps of a ledger table (``zephon ledger --parquet``: sources by name) whose rows hold ``document``."""
    cols = table.select(["step", "source", "document"]).to_pydict()
    assert set(cols["source"]) == set(NAMES), "a ledger of both sources, by name"
    return sorted({s for s, src, d in zip(cols["step"], cols["source"], cols["document"]) if (src, d) == document})
