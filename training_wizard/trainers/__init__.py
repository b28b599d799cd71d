"""Trainers by role: config/ (options, batch plan, key checks), loop/ (the on-policy iteration, update, optimizer
step, run state, metrics), algorithms/ (RLOO, PPO, GRPO), supervised/ (SFT, reward models, classification)."""
