"""Evaluation by pairwise judgement: win rates with confidence intervals, judges, and their reports."""
