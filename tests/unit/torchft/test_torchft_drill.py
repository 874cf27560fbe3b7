"""The drill (``zephon_torchft.drill``) refuses a recipe's ``[surgery]`` table at start-up, as TorchTitan's live loader
does: its pipeline would not apply it, and live mode could not honour it (``live_data_problems``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchft")

from zephon_core import ConfigError  # noqa: E402
from zephon_torchft import drill  # noqa: E402

BASE = ["--lighthouse", "x", "--replica-id", "0", "--steps", "1", "--log", "unused.jsonl"]


def test_a_recipe_with_a_surgery_table_is_refused_in_one_line():
    args = drill.parse_args(BASE)
    recipe = drill.load(args)
    drill.zephon_pipeline(args, recipe).close()  # the bundled recipe has none
    with_table = drill.load_recipe(args.recipe, {"canonical_replicas": 12, "surgery": {"skip_steps": ["2..3"]}})
    refused = r"^zephon live mode: .*surgery: a \[surgery\] table \(skip_steps, quarantine\) is refused in live mode"
    with pytest.raises(ConfigError, match=refused) as e:
        drill.zephon_pipeline(args, with_table)
    assert "\n" not in str(e.value)
