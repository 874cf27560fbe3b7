"""P11's replica group: ``python -m zephon_torchft.drill`` with wall-clock times added (a thin wrapper).

    PYTHONPATH=.:bench python bench/goals/p11_live/live_replica.py
        DRILL-ARGS...   (the arguments of python -m zephon_torchft.drill)

It runs the drill unchanged and adds, for the join figure of live_faults.py:

* ``"t"`` on every line of the drill's ``--log`` (``time.time()`` when the line is written: the end of the
  attempt, after the commit vote);
* ``<log>.times``: one JSON line ``{"ready_t"}`` once the model is built (before ``--start-when`` is awaited:
  imports and data loaded), and ``{"manager_t"}`` when the torchft Manager is built (this group joins the quorum).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from zephon_torchft import drill


def _note(log: str, **fields: float) -> None:
    with open(log + ".times", "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


def instrument(argv: list[str]) -> None:
    """Wrap the drill's model builder, Manager builder and log writer to record when they ran."""
    log = drill.parse_args(argv).log
    build_model, build_manager, write = drill.build_model, drill.build_manager, drill.Drill.write

    def timed_model(*a: Any, **k: Any) -> Any:
        out = build_model(*a, **k)
        _note(log, ready_t=time.time())
        return out

    def timed_manager(*a: Any, **k: Any) -> Any:
        _note(log, manager_t=time.time())
        return build_manager(*a, **k)

    def timed_write(self: Any, record: dict[str, Any]) -> None:
        write(self, {**record, "t": time.time()})

    drill.build_model = timed_model  # type: ignore[assignment]
    drill.build_manager = timed_manager  # type: ignore[assignment]
    drill.Drill.write = timed_write  # type: ignore[method-assign]


if __name__ == "__main__":
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print("usage: bench/goals/p11_live/live_replica.py DRILL-ARGS... (see python -m zephon_torchft.drill --help)\n"
              + __doc__)
        sys.exit(0)
    instrument(sys.argv[1:])
    sys.exit(drill.main(sys.argv[1:]))
