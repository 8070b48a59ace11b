from rlsteps.engine.rewards.rm.command import main

main()
