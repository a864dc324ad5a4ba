"""meshd pytest plugin (fixtures added below)."""
