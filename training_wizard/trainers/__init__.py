"""Trainers: the batch glossary and configs, the shared on-policy loop, RLOO."""
