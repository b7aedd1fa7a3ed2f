"""Reinforcement learning: one step (step.py: collect rollouts, score, update), its tensor math (algorithms.py),
the batch envelope (batch.py), the optimizer (optim.py), per-token logprobs and micro-batches (logprobs.py),
what a run keeps on disk (checkpoints.py), several processes (distributed.py) and the group-shared training
forward (prefix_sharing.py)."""
