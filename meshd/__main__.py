"""``python -m meshd`` is the ``meshd`` command."""

import sys

from .cli import meshd_main

sys.exit(meshd_main())
