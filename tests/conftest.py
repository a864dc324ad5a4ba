"""Suite-wide settings. Fixtures for real daemons come from the meshd.testing plugin."""

import os

from hypothesis import HealthCheck, settings

# The daemon tests see meshd's own behaviour, whatever plugins are installed beside it: entry-point
# plugins are not loaded (meshd/plugins/host.py AUTOLOAD_ENV; inherited by every daemon a test
# starts). The tests about entry-point plugins turn it back on for their daemons and name the
# plugin they expect.
os.environ["MESHD_DISABLE_PLUGIN_AUTOLOAD"] = "1"

# Two cores shared with real daemons: wall-clock deadlines would make property tests flaky.
settings.register_profile("meshd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("meshd")
