"""The application layer: what a caller does with executions, each use case once.

REST, A2A, MCP, the console and the schedule ticker are translations of their protocols onto
these calls: a start (`starts`), a wait until the end, an answer or the listener's close
(`waits`), a cancel for a caller (`cancels`), an answer to a pending request (`answering`),
and finding or listing what a caller may reach (`access`). A refusal is one neutral value
(`refusals.Refusal`) that each front maps to its own error. This layer sits between the
runtime (the registry, the store) and the fronts; it knows no protocol.
"""
