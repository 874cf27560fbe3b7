"""The curriculum: which documents make up global chunk ``g``, as a pure function of ``g``."""

from zephon_core.curriculum.mixture import Chunk, StaticMixture
from zephon_core.curriculum.permutation import IndexPermutation

__all__ = ["Chunk", "IndexPermutation", "StaticMixture"]
