"""An environment that owns the data: `reset()` returns each episode's prompt, so the trainer is given no dataset
and `max_steps` sets the run's length (TRL 1.16's GRPO environment page).

    python trl_env_reset_prompt.py MODEL_DIR OUTPUT_DIR
"""

import random
import sys

from training_wizard import GRPOConfig, GRPOTrainer


class GuessingGame:
    def __init__(self):
        self.secret = 0
        self.solved = False

    def reset(self, **kwargs) -> str:
        self.secret, self.solved = random.randint(1, 4), False
        return "I picked a number from 1 to 4. Call guess to find it."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess.
        """
        self.solved = number == self.secret
        return "right" if self.solved else "wrong"

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0


def main(model: str, output_dir: str) -> None:
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16)
    trainer = GRPOTrainer(model=model, args=args, environment_factory=GuessingGame)
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
