"""The adapters' one door into the core: everything a training-framework adapter needs, in one place.

An adapter translates framework facts (mesh sizes, batch sizes, its own flag names) into these
calls and nothing more, and imports only ``zephon_core``, this package (and its modules) and, for
live mode, ``zephon_core.live`` (``tests/unit/project/test_code_shape.py`` holds it to that):

* ``coordination``: the training recipe (``load_training_recipe``), ``canonical_replicas`` and the
  aggregation settings (``resolve_coordination``), the pipeline options they make, ``bundled_configs``;
* ``plan``: the one start-up plan (``startup_plan(recipe, Facts, Asked)`` -> ``StartupPlan``: the recipes
  loaded once, the lanes resolved once, coordination, held-out sets, step rules; ``problems`` -> ``refuse``);
* ``rules``: the start-up rules of the elastic guarantee (``topology_problems``, ``refuse``), worded
  in the framework's ``Terms``; a steered mixture's checkpoints only at logged steps (``SaveClock``,
  ``unlogged_saves``);
* ``announce``: the lines an adapter logs about Zephon (``startup_line``: recipe, lanes, data-parallel degree;
  ``lanes_line``: a rank's lanes; ``restored_line``: where a resumed state stood, from and to which degree);
* ``trial``: what the laptop commands (``python -m zephon_torchtitan.cpu`` / ``zephon_megatron.cpu``) share;
* ``metrics``: ``IntervalMetrics``, ``Pipeline.stats()`` as a framework's logger shows it every interval;
* ``source_loss``: per-source training loss (``label_sources(batch)``: a source id per label token;
  ``SourceLoss``, a step's reduced figures; ``add_source_loss_hook`` / ``publish_source_loss``);
* ``batch_log``: the per-batch audit log (``ZEPHON_BATCH_LOG``): ``audited(batches, rank)`` is its one
  writer (``batch_of``: the batch, or a received batch's identity, ``LoggedBatch``, in what is taken;
  ``identity``: ``log_identity(pipeline.definition())``, the run and launch each line carries),
  ``read_batch_log`` reads it;
* ``state_readers``: reading a state out of JSON or, through the readers adapters register, their
  framework's checkpoints (``StateReader``);
* ``frameworks``: each framework's conventions as data (``FrameworkConventions``: BOS/EOS around each document,
  default sizes, flag names), registered as ``zephon.frameworks`` entry points for ``--framework`` and
  ``zephon diff`` (``framework_of``);
* ``IntegrationError``: the one error type of an adapter's refusals;
* steering and surgery, which an adapter drives step by step: ``MixingLoader``, ``Mixing``, ``LocalFigures``,
  a journaled ``Decision`` and its ``DENOMINATOR`` (``pipeline.mixing``, ``curriculum.journal``);
  ``SurgeryRequest``/``apply_surgery`` and the surgery journal (``SurgeryJournal``, ``Skip``,
  ``surgery_journal_of``, ``skip_of``, ``add_skips`` (the one skip rule): ``checkpoint.surgery``);
* and the few core pieces an adapter handles itself: ``Recipe``/``load_recipe``, ``parse_lanes``
  (a state's lanes, validated), ``load_tokenizer`` and ``write_atomically``.
"""

from zephon_core.checkpoint.state import parse_lanes
from zephon_core.checkpoint.surgery import Skip, SurgeryJournal, add_skips, skip_of, surgery_journal_of
from zephon_core.curriculum.journal import DENOMINATOR, Decision
from zephon_core.errors import IntegrationError
from zephon_core.integration.announce import lanes_line, restored_line, startup_line
from zephon_core.integration.batch_log import (
    ENV as BATCH_LOG_ENV,
)
from zephon_core.integration.batch_log import (
    Audited,
    LoggedBatch,
    LogIdentity,
    audited,
    log_identity,
    log_line,
    open_batch_log,
    read_batch_log,
)
from zephon_core.integration.coordination import (
    Coordination,
    bundled_configs,
    load_training_recipe,
    pipeline_options,
    resolve_canonical_replicas,
    resolve_coordination,
)
from zephon_core.integration.metrics import IntervalMetrics, LoggedFigures, console_line
from zephon_core.integration.plan import Asked, Facts, HeldOut, StartupPlan, startup_plan
from zephon_core.integration.rules import (
    SaveClock,
    Terms,
    Topology,
    divisors,
    next_multiple,
    refuse,
    topology_problems,
    unlogged_saves,
    warn_unknown_step_size,
)
from zephon_core.integration.source_loss import (
    SourceLoss,
    SourceLossHook,
    add_source_loss_hook,
    label_sources,
    publish_source_loss,
    source_loss_of,
)
from zephon_core.integration.state_readers import StateReader, StateReadError, load_state
from zephon_core.io.atomic import write_atomically
from zephon_core.lane.tokenizer_file import load_tokenizer
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.pipeline.surgery import SurgeryRequest, apply_surgery
from zephon_core.recipe import Recipe, load_recipe

__all__ = [
    "BATCH_LOG_ENV",
    "DENOMINATOR",
    "Decision",
    "LocalFigures",
    "Mixing",
    "MixingLoader",
    "Skip",
    "SurgeryJournal",
    "SurgeryRequest",
    "add_skips",
    "apply_surgery",
    "skip_of",
    "surgery_journal_of",
    "Asked",
    "Audited",
    "Coordination",
    "Facts",
    "HeldOut",
    "IntegrationError",
    "IntervalMetrics",
    "LoggedBatch",
    "LoggedFigures",
    "Recipe",
    "SourceLoss",
    "SourceLossHook",
    "SaveClock",
    "StartupPlan",
    "StateReadError",
    "StateReader",
    "Terms",
    "Topology",
    "add_source_loss_hook",
    "audited",
    "bundled_configs",
    "console_line",
    "divisors",
    "label_sources",
    "load_recipe",
    "load_state",
    "load_training_recipe",
    "load_tokenizer",
    "LogIdentity",
    "log_identity",
    "log_line",
    "next_multiple",
    "lanes_line",
    "open_batch_log",
    "parse_lanes",
    "pipeline_options",
    "publish_source_loss",
    "read_batch_log",
    "refuse",
    "startup_plan",
    "resolve_canonical_replicas",
    "resolve_coordination",
    "restored_line",
    "startup_line",
    "source_loss_of",
    "topology_problems",
    "unlogged_saves",
    "warn_unknown_step_size",
    "write_atomically",
]
