"""The apps the tests serve. Server processes run with this folder as their working
directory and load them as top-level modules (`agent-server run tests_app:agent`); in-process
tests import them as `tests.apps.<module>`."""
