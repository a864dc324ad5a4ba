"""``python -m meshd`` is the ``meshd`` command; with ``--settings-fd N`` it is the image ``meshd run``
re-execs (meshd/reexec.py), which goes straight to meshd/daemon_run.py without argparse."""

import sys

if "--settings-fd" in sys.argv[1:]:
    from .daemon_run import image_main

    sys.exit(image_main(sys.argv[1:]))

from .cli import meshd_main

sys.exit(meshd_main())
