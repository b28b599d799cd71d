"""Rollouts: prompt order, generation backends, the trajectory batch and its sources (single replies, episodes with
environments and tools, the asynchronous schedule). Shared by RLOO, PPO and GRPO."""
