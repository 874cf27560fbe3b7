"""Live mode: replica groups leave and join a running job (torchft), and every committed step keeps its samples."""

from zephon_core.live.lanes import LiveLanes, LiveStep
from zephon_core.live.plan import (
    StepPlan,
    active_participants,
    exact_participant_counts,
    live_data_problems,
    live_problems,
    plan_step,
)

__all__ = ["LiveLanes", "LiveStep", "StepPlan", "active_participants", "exact_participant_counts", "live_data_problems",
           "live_problems", "plan_step"]
