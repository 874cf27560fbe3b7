"""Check the threads and processes a node will run before launching at scale.

Run with: python docs/examples/explain_plan.py
"""

from common import with_operators, work_source

from zephon_core import Pipeline

pipeline = with_operators(Pipeline(work_source())).options(dp_degree=8, dp_group_id=0)
# Eight pipelines share each 8-GPU node; the plan multiplies the per-pipeline cost.
print(pipeline.explain(pipelines_per_node=8))
