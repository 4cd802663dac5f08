"""Loaded into a spawned worker (TURNKEEPER_TOOL_MODULES): while the file named by
TK_SLOW_STORE exists, the store's turn updates hang, as a write does on a worker
that is about to die."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from turnkeeper.store.core import SQLStore

_update_turn = SQLStore.update_turn


async def _held(self: SQLStore, *args: Any, **kwargs: Any) -> Any:
    marker = Path(os.environ["TK_SLOW_STORE"])
    while marker.exists():
        await asyncio.sleep(0.05)
    return await _update_turn(self, *args, **kwargs)


SQLStore.update_turn = _held  # type: ignore[method-assign]
