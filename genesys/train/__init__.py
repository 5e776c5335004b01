"""Training on verified rollouts: the rollout source's group filter (`genesys.train.groups`)."""
