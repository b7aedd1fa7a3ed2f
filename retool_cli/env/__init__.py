"""The environment a policy acts in: the code interpreter (sandbox.py, its jailed worker sandbox_worker.py), how
model and interpreter talk (protocol.py), and how an answer is scored (reward.py, with judge.py in its workers)."""
