"""``accelerate launch -m kimi_vl.train --config CONFIG.yaml key=value ...``."""

import sys

from kimi_vl.train.cli import main

sys.exit(main(prog="python -m kimi_vl.train"))
