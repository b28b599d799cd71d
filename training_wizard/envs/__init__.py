"""Adapters for environment libraries (reasoning-gym, OpenEnv)."""
