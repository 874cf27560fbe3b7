"""``python -m zephon_core.cli``: the ``zephon`` command."""

import sys

from zephon_core.cli.app import main

sys.exit(main())
