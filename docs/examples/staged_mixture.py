"""A staged curriculum in Python: token-weighted stages, a source added from a stage on, and a resume
into the same schedule with a stage appended.

Run with: python docs/examples/staged_mixture.py
"""

from zephon_core import MemorySource, Pipeline, Stage, StagedMixture

web = MemorySource([[1] * (5 + i % 40) for i in range(300)], name="web")
code = MemorySource([[2] * (60 + i % 90) for i in range(100)], name="code")
math = MemorySource([[3] * (10 + i % 20) for i in range(80)], name="math")
warmup = Stage({"web": 0.9, "code": 0.1}, name="warmup")
main = Stage({"web": 0.6, "code": 0.3, "math": 0.1}, name="main", start_tokens=20_000, weight_by="tokens")
anneal = Stage({"code": 0.5, "math": 0.5}, name="anneal", start_tokens=60_000, weight_by="tokens")


def pipeline(stages, sources):
    ws = StagedMixture(sources, stages, seed=7, chunk_size=16)
    return Pipeline(ws).pack(64).batch(4).options(canonical_replicas=4, dp_degree=1, dp_group_id=0, prefetch=0)


first = pipeline([warmup, main], [web, code, math])
it = iter(first)
before = [next(it).digest for _ in range(40)]
state = first.checkpoint()
first.close()

resumed = pipeline([warmup, main, anneal], [web, code, math])
print(resumed.resume_verdict(state).message)
resumed.restore(state)
it = iter(resumed)
after = [next(it).digest for _ in range(200)]
resumed.close()

whole = pipeline([warmup, main, anneal], [web, code, math])
it = iter(whole)
assert before + after == [next(it).digest for _ in range(240)], "the resumed run must be the run of the whole schedule"
whole.close()
print("resumed with the anneal stage appended: 240 batches identical to the whole schedule from the start")
print("\n".join(whole.work_source.describe()))
