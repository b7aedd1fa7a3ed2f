"""retool: an experiment suite for reinforcement learning of tool-integrated math reasoning."""

__version__ = "0.1.0"
