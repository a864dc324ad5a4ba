"""Small utilities every layer may use: log-once, back-off, paths, private files, supervised loops.

May import: :mod:`meshd.errors` only (standard library otherwise). Holds no meshd behaviour.
"""
