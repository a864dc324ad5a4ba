"""Plugins shipped with meshd. The node registers them from the config (they are not entry points):

* :class:`JsonlDeadLetterSink` when ``dead_letter_jsonl`` is true, writing
  ``<state_dir>/deadletters.jsonl``.
"""

from meshd.plugins.builtin.jsonl_sink import JsonlDeadLetterSink

__all__ = ["JsonlDeadLetterSink"]
