"""Everything that touches the world from activities: model calls, tools, the
store writes the workflow asks for, and the reconciler's pass. The session store
itself is `turnkeeper.store`."""
