"""The worker and what it wires up: `main` (connect, register, serve), the embedded
Temporal dev server it starts, the executor of workflow activations on its event
loop, and the reconcile schedule it creates. The one place of the package that
imports the activities and the workflows to run them.

Empty on purpose: the client imports `dev_server` from here without the worker.
"""
