"""``python -m zephon_megatron.cpu``: see ``trial.py``."""

import sys

from zephon_megatron.cpu.trial import main

sys.exit(main())
