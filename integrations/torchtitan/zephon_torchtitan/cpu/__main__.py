"""``python -m zephon_torchtitan.cpu``: see ``trial.py``."""

import sys

from zephon_torchtitan.cpu.trial import main

sys.exit(main())
