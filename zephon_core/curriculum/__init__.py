"""The curriculum: which documents make up global chunk ``g``, as a pure function of ``g``.

``work_source`` defines the interface (``WorkSource``, ``Chunk``) and the per-chunk
interleave; ``order`` maps positions of a source's stream to its documents;
``mixture_base`` is what both mixtures share (``Mixture``); ``mixture`` is the
fixed-weight mixture; ``stages`` the staged one (its
``schedule``, ``token_index`` for token weights, ``stage_report`` for
``explain``); ``permutation`` the seekable permutations.
"""

from zephon_core.curriculum.mixture import StaticMixture
from zephon_core.curriculum.permutation import IndexPermutation
from zephon_core.curriculum.stages import Stage, StagedMixture
from zephon_core.curriculum.work_source import Chunk, WorkSource

__all__ = ["Chunk", "IndexPermutation", "Stage", "StagedMixture", "StaticMixture", "WorkSource"]
