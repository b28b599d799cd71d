"""One file per algorithm on the shared loop: RLOO, PPO, GRPO."""
