"""``python -m eval ...`` = ``kimi-vl eval ...`` (see :mod:`eval.cli`)."""

import sys

from eval.cli import main

sys.exit(main())
