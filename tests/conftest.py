"""Suite-wide settings. Fixtures for real daemons come from the meshd.testing plugin."""

from hypothesis import HealthCheck, settings

# Two cores shared with real daemons: wall-clock deadlines would make property tests flaky.
settings.register_profile("meshd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("meshd")
