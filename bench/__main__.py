"""``python -m bench``: every benchmark on every backend (see ``bench/run.py``)."""

import sys

from bench.run import main

sys.exit(main())
