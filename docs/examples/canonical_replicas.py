"""Fix the number of lanes at the start of a run so it can later change size.

Run with: python docs/examples/canonical_replicas.py
"""

from common import with_operators, work_source

from zephon_core import Pipeline, merge_states

# Eight lanes: 4 groups own two each now; the run can resume on 8, 2 or 1.
groups = [
    with_operators(Pipeline(work_source())).options(canonical_replicas=8, dp_degree=4, dp_group_id=g, prefetch=0)
    for g in range(4)
]
iterators = [iter(p) for p in groups]
for it in iterators:  # one global step of 8 batches: two per group, one per lane
    next(it), next(it)
state = merge_states([p.checkpoint() for p in groups])

# Resume on two groups: each now owns four lanes and continues them exactly.
resumed = with_operators(Pipeline(work_source())).options(canonical_replicas=8, dp_degree=2, dp_group_id=0, prefetch=0)
resumed.restore(state)
print("dp group 0 of 2 owns lanes", resumed.identity.lanes, "and starts with", next(iter(resumed)).digest)
for p in groups + [resumed]:
    p.close()
