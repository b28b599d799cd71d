"""The on-policy loop: iteration, update, optimizer step, run state, metrics."""
