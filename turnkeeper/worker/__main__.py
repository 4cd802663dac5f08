"""`python -m turnkeeper.worker`: the same as `turnkeeper worker`."""

from turnkeeper.worker.main import main

main()
