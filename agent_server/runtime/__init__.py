"""The runtime: this process's work on the records of the store.

Admission and the attempts in flight (`registry`, the facade over `admission`, `attempt`
and `attempts`, `settle`, `inputs` and `observer`), queued and handed-off work (`durable`),
sessions (`sessions`), metrics (`metrics`), traces (`tracing`), logs (`logs`), webhooks
(`webhooks`), settings (`settings`), the shutdown sequence (`shutdown`), exits and the
watchdog (`exits`), signals (`signals`), the loop's error handler and stall sampler
(`loop_errors`, `loop_lag`), and the shutdown push (`pushgateway`). The shutdown sequence
lives here, not in `process`, because the Agent (an ASGI app any server can run) owns it.
"""
