"""How long a test waits before it calls a child process or a server hung.

These limits catch hangs, not slowness: CI shares noisy 2-core machines, and a
child that imports a framework, compiles, or serves a run can take minutes
there (a bench smoke run of two backends took over 120 s beside two CPU hogs
and a training job). A test that measures speed is a benchmark, not a test.
"""

# A child process of a test: a bench's smoke run, the CLI, a fresh interpreter, node.
CHILD_S = 600
# One HTTP request of a test to a server on this machine.
REQUEST_S = 120
# A TensorBoard started by a test, until it has loaded what the test waits for.
SERVER_START_S = 300
# A state a test polls for: a TensorBoard reload, a background upload's retry.
POLL_S = 120
