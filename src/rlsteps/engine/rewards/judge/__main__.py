from rlsteps.engine.rewards.judge.command import main

main()
