"""Each training framework's conventions, declared once as data: how its adapter tokenizes and sizes a run.

``zephon trace``/``explain``/``verify-elastic --framework NAME`` follow them to rebuild a training recipe's
pipeline as that framework's run built it, and ``zephon diff CHECKPOINT RECIPE`` matches a checkpoint's
definition against them (``framework_of``). Frameworks are registered as entry points of the group
``zephon.frameworks``, each naming a ``FrameworkConventions``, so the core never imports an adapter::

    [project.entry-points."zephon.frameworks"]
    torchtitan = "zephon_core.integration.frameworks:TORCHTITAN"

TorchTitan's and Megatron's are declared here (their adapters' tokenization is fixed by the frameworks);
a third adapter declares its own in its package and registers it the same way (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from zephon_core.curriculum.definition import parse_definition
from zephon_core.errors import ConfigError

GROUP = "zephon.frameworks"


@dataclass(frozen=True)
class FrameworkConventions:
    """What a framework's adapter adds around each document, and its default sizes (None: the framework has none)."""

    name: str
    bos: bool  # a BOS token before each document (the tokenizer's bos id)
    eos: bool  # an EOS/EOD token after each document (the tokenizer's eos id)
    seq_len: int | None
    batch_size: int | None
    seq_len_flag: str  # the framework's names for them, for messages
    batch_size_flag: str
    tokenizer_flag: str

    def tokenizes_as(self, tokenize: Mapping[str, Any]) -> bool:
        """Whether a definition's tokenize op shows this framework's special tokens around each document."""
        return (tokenize.get("bos_id") is not None) == self.bos and (tokenize.get("eos_id") is not None) == self.eos


TORCHTITAN = FrameworkConventions("torchtitan", bos=True, eos=True, seq_len=2048, batch_size=8,
                                  seq_len_flag="training.seq_len", batch_size_flag="training.local_batch_size",
                                  tokenizer_flag="hf_assets_path")
MEGATRON = FrameworkConventions("megatron", bos=False, eos=True, seq_len=None, batch_size=None,
                                seq_len_flag="--seq-length", batch_size_flag="--micro-batch-size",
                                tokenizer_flag="--tokenizer-model")


def framework_names() -> list[str]:
    """The registered frameworks' names, sorted (cheap: nothing is imported): the core's own two and every entry
    point's."""
    return sorted({TORCHTITAN.name, MEGATRON.name} | {ep.name for ep in metadata.entry_points(group=GROUP)})


def registered() -> dict[str, FrameworkConventions]:
    """Every registered framework's conventions, by name: the two the core ships, then each entry point (an adapter's
    own, or one of these two again); an entry point that is not a ``FrameworkConventions`` (or names another
    framework) is refused, naming it. The core's own two do not depend on the installed metadata: a clone whose
    metadata predates an entry point still knows them."""
    out = {TORCHTITAN.name: TORCHTITAN, MEGATRON.name: MEGATRON}
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        conv = ep.load()
        if not isinstance(conv, FrameworkConventions) or conv.name != ep.name:
            raise ConfigError(f"entry point {ep.name} = {ep.value} of {GROUP} is not a FrameworkConventions named "
                              f"{ep.name!r}: fix the adapter's pyproject.toml")
        out[ep.name] = conv
    return out


def conventions(name: str, frameworks: Mapping[str, FrameworkConventions] | None = None) -> FrameworkConventions:
    """The conventions of the framework ``name``; one not registered is refused, naming those that are."""
    frameworks = registered() if frameworks is None else frameworks
    if name not in frameworks:
        raise ConfigError(f"--framework {name}: no installed adapter registers it ({GROUP}); pass one of "
                          f"{', '.join(sorted(frameworks)) or 'none installed'}")
    return frameworks[name]


def framework_of(definition: Mapping[str, Any], frameworks: Mapping[str, FrameworkConventions] | None = None) -> str:
    """The one framework whose conventions a checkpoint's ``definition`` shows; none or several: refused in one
    line asking for ``--framework``.

    A pretokenized definition has no tokenize op: no convention is at issue (its sizes are in the definition, and
    every framework builds the same pipeline from it), so the first registered by name answers.
    """
    frameworks = registered() if frameworks is None else frameworks
    tokenize = parse_definition(definition).op("tokenize")
    if tokenize is None and frameworks:
        return sorted(frameworks)[0]
    matches = sorted(n for n, c in frameworks.items() if tokenize is not None and c.tokenizes_as(tokenize))
    if len(matches) == 1:
        return matches[0]
    shown = f"bos_id {tokenize.get('bos_id')}, eos_id {tokenize.get('eos_id')}" if tokenize is not None else "none"
    which = f"{' and '.join(matches)} all tokenize so" if matches else "no registered framework tokenizes so"
    raise ConfigError(f"the checkpoint's tokenization ({shown}) matches {len(matches)} frameworks' conventions "
                      f"({which}): pass --framework as the run had it")
