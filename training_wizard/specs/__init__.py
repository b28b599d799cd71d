"""Specs that build objects: models, data sources, rewards."""
