"""The demo: a real elastic TorchTitan training run on CPU, fed by Zephon.

1. llama3's debug model trains 4 steps on 4 ranks (dp=4) and checkpoints;
2. the run resumes from that checkpoint on 2 ranks (dp=2, same global batch)
   and trains steps 5 and 6;
3. every global step's batches are compared with Zephon's own plan for an
   uninterrupted run, and the losses are shown across the resize.

CPU-only TorchTitan needs the CPU shim zephon_torchtitan/cpu/shim.py, launched through scripts/torchtitan_cpu
(which the e2e tests use too; `python -m zephon_torchtitan.cpu` is the same run as a package command).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from torchtitan_cpu.runs import (  # next to this script
    ASSETS,
    GLOBAL_BATCH,
    LOCAL_BATCH,
    RECIPE,
    SEQ_LEN,
    launch,
    steps_of,
)


def planned_steps(steps: int) -> dict[int, dict[tuple[int, int], str]]:
    """What an uninterrupted run must see: the data path alone, one group owning every lane."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from zephon_core.recipe import load_recipe
    from zephon_torchtitan.core import TokenizerAdapter

    recipe = load_recipe(RECIPE)
    C = recipe.spec.canonical_replicas
    tok = TokenizerAdapter(HuggingFaceTokenizer(tokenizer_path=str(ASSETS)))
    p = recipe.build(seq_len=SEQ_LEN, batch_size=LOCAL_BATCH, tokenizer=tok, bos_id=tok.bos_id, eos_id=tok.eos_id,
                     dp_degree=1, dp_group_id=0, prefetch=0)
    per_lane = GLOBAL_BATCH // LOCAL_BATCH // C
    plan: dict[int, dict[tuple[int, int], str]] = {}
    with p:
        for b, _ in zip(p, range(steps * C * per_lane)):
            plan.setdefault(b.lane_index // per_lane + 1, {})[(b.lane, b.lane_index)] = b.digest
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="zephon-demo-"))
    from zephon_core.recipe import load_recipe

    C = load_recipe(RECIPE).spec.canonical_replicas
    print(f"zephon demo: TorchTitan 0.3 llama3 debug model on CPU, canonical_replicas={C}, "
          f"global batch {GLOBAL_BATCH} = {GLOBAL_BATCH // LOCAL_BATCH} batches of {LOCAL_BATCH} x {SEQ_LEN} tokens per step")
    print(f"  [1/3] training steps 1-4 on 4 ranks (dp=4) with a checkpoint ...  (logs in {work})", flush=True)
    first = launch("0.3", 4, work / "dp4", steps=4)
    print("  [2/3] resuming from step 4 on 2 ranks (dp=2) for steps 5-6 ...", flush=True)
    second = launch("0.3", 2, work / "dp2", steps=6, resume_from=work / "dp4" / "checkpoint" / "step-4")
    print("  [3/3] comparing every global step with an uninterrupted run's plan", flush=True)
    plan = planned_steps(6)
    got = {**steps_of(work / "dp4", C), **steps_of(work / "dp2", C)}
    losses = {**first.losses, **second.losses}
    ok = second.start_step == 5
    print("\n  step  ranks  loss      samples")
    for step in range(1, 7):
        same = got.get(step) == plan[step] and len(plan[step]) == C
        ok &= same
        print(f"  {step:4d}  {'dp=4' if step <= 4 else 'dp=2'}   {losses.get(step, float('nan')):8.5f}  {'match' if same else 'DIFFERENT'}")
    continued = losses[5] < losses[1]
    ok &= continued
    print()
    if ok:
        print(f"every global step's samples matched the uninterrupted plan across dp=4 -> dp=2, "
              f"and the loss continued from the checkpoint ({losses[4]:.5f} at step 4 -> {losses[5]:.5f} at step 5)")
        return 0
    print("the elastic run did NOT match (see the table above)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
