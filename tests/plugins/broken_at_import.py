"""A plugin module whose import fails (a user's bug)."""

raise RuntimeError("plugin bug at import")
