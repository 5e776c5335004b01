"""Whole-dataset work on rollout files and training runs, for people deciding what to train on next.

- `filtering`: tasks by pass rate over their rollouts (`genesys filter`).
- `report`: plots and a markdown summary of verified rollouts (`genesys report`).
- `report_training`: the curves and summary of a training run's `metrics.jsonl`.
"""
