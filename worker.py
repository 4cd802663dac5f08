"""Run the worker from a checkout: `python worker.py`, the same as `turnkeeper worker`.

The worker itself is `turnkeeper.worker` (turnkeeper/worker.py), installed with the
package; this file is not installed.
"""

from turnkeeper.worker import main

if __name__ == "__main__":
    main()
