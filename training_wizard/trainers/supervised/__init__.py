"""The supervised loop and its trainers: SFT, reward models, sequence classification."""
