"""The run's lifecycle: the worker process, the training loop, the train phase, signals, the run lock and identity,
and the first check of the Python it runs in."""
