"""Rollouts: prompt order, generation, and the no-grad logprob and reward passes. Shared by RLOO and PPO."""
