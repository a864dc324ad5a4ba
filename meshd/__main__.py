"""``python -m meshd`` is the ``meshd`` command; with ``--settings-fd N`` it is the image ``meshd run``
re-execs (meshd/daemon/reexec.py), which goes straight to meshd/daemon/run.py without argparse."""

import sys

if "--settings-fd" in sys.argv[1:]:
    from meshd.daemon.run import image_main

    sys.exit(image_main(sys.argv[1:]))

from meshd.cli.main import meshd_main

sys.exit(meshd_main())
