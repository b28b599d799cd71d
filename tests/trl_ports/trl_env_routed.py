"""Two environments in one run: a dict of factories, each row's `environment` column choosing its own, and the
dataset holding only that column (each `reset()` supplies the prompt), as TRL 1.16's multi-environment example.

    python trl_env_routed.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


class Counter:
    def reset(self, **kwargs) -> str:
        self.total = 0
        return "Add numbers with add until the total is 5."

    def add(self, value: int) -> int:
        """Add a number to the total.

        Args:
            value: The number to add.
        """
        self.total += value
        return self.total

    def get_reward(self) -> float:
        return 1.0 if self.total == 5 else 0.0


class Speller:
    def reset(self, **kwargs) -> str:
        self.word = ""
        return "Spell the word cat with the letter tool."

    def letter(self, char: str) -> str:
        """Write one letter.

        Args:
            char: The letter.
        """
        self.word += char
        return self.word

    def get_reward(self) -> float:
        return 1.0 if self.word == "cat" else 0.0


def main(model: str, output_dir: str) -> None:
    dataset = Dataset.from_dict({"environment": ["counter", "speller", "counter", "speller"]})
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16)
    trainer = GRPOTrainer(model=model, args=args, train_dataset=dataset,
                          environment_factory={"counter": Counter, "speller": Speller})
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
