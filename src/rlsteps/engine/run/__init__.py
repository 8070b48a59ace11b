"""The run's lifecycle: the worker process, the training loop, the train phase, signals, its logs and exit code, the
run's identity, and the first check of the Python it runs in (the run lock and output.dir's checks are the
contract's)."""
