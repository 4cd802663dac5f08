"""Run the worker from a checkout: `python worker.py`, the same as `turnkeeper worker`.

The worker itself is `turnkeeper.worker.main` (turnkeeper/worker/main.py), installed with the
package; this file is not installed.
"""

from turnkeeper.worker.main import main

if __name__ == "__main__":
    main()
