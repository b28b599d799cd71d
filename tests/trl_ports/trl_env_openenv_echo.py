"""OpenEnv's echo environment in the shape of TRL 1.16's examples/scripts/openenv/echo.py: the factory wraps a
client (`reset()` and `step(action)` returning a result with `observation`, `reward` and `done`), its tool sends
the model's message, and the environment's reward is what the client reported. The client here answers in the
process (OpenEnv's interface, no server), so the script runs offline.

    python trl_env_openenv_echo.py MODEL_DIR OUTPUT_DIR
"""

import sys
from dataclasses import dataclass

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


@dataclass
class EchoObservation:
    echoed_message: str


@dataclass
class StepResult:
    observation: EchoObservation
    reward: float
    done: bool


class EchoClient:
    """OpenEnv's EchoEnv client interface: reset() and step(message), rewarding the message's length."""

    def reset(self) -> StepResult:
        return StepResult(EchoObservation(""), 0.0, False)

    def step(self, message: str) -> StepResult:
        return StepResult(EchoObservation(message), 0.1 * len(message), False)


class EchoEnvironment:
    def __init__(self):
        self.client = EchoClient()
        self.reward = 0.0

    def reset(self, **kwargs) -> None:
        self.client.reset()
        self.reward = 0.0

    def echo(self, message: str) -> str:
        """Echo a message back.

        Args:
            message: The message to echo.
        """
        result = self.client.step(message)
        self.reward = result.reward
        return result.observation.echoed_message


def reward_from_env(environments, **kwargs):
    return [environment.reward for environment in environments]


def main(model: str, output_dir: str) -> None:
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Echo a short word."}]] * 2})
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_from_env, args=args, train_dataset=dataset,
                          environment_factory=EchoEnvironment)
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
