"""What the worker and the clients report: turnkeeper's metrics (`metrics`, safe
in workflow code), where metrics and traces are sent (`exporters`), and what the
worker's log may say once payloads are encrypted (`logs`)."""
