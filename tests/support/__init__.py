"""What the tests share: real server processes, Redis, haproxy, the fault harness, and the
helpers more than one test module uses. Imported as `tests.support.<module>`."""
