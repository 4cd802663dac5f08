"""Everything that touches the world: model calls, tools, the session store."""
