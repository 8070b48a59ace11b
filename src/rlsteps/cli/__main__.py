from rlsteps.cli.app import entry

entry()
