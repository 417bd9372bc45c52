"""``python -m bayesmlc.bench --suite quick --out DIR``: the same as ``bayesmlc bench``."""

import sys

from .cli import main

sys.exit(main())
