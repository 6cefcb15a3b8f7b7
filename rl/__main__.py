"""``python -m rl --config ...`` / ``accelerate launch -m rl --config ...``: the RL trainer."""

import sys

from rl.trainer import main

sys.exit(main())
