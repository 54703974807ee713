"""``python -m rankwise.cli`` is the ``rankwise`` command."""

import os
import sys

from rankwise.cli import main

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.exit(main())
