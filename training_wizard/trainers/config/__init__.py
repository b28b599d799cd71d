"""Configs of the on-policy trainers: options, batch plan, key checks."""
