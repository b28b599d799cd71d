"""The lines TRL's example scripts run after `trainer.train()` (trl/scripts/grpo.py, the GRPO quick start):
the train result's metrics printed and saved, the trainer state saved, the model saved into `args.output_dir`,
the log history and step count read, and the Hub upload (offline here: it ends in one line).

    python trl_post_train.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def reward_len(completions, **kwargs):
    """Completions near 20 characters score best."""
    return [-abs(20 - len(completion)) for completion in completions]


if __name__ == "__main__":
    model_name, output_dir = sys.argv[1], sys.argv[2]
    dataset = Dataset.from_list([{"prompt": f"Tell me a fact about the number {i}."} for i in range(4)])
    training_args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=4,
                               max_completion_length=8, logging_steps=1)
    trainer = GRPOTrainer(model=model_name, reward_funcs=reward_len, args=training_args, train_dataset=dataset)

    train_result = trainer.train()
    metrics = train_result.metrics
    metrics["train_samples"] = len(dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    trainer.save_model(training_args.output_dir)
    print(f"steps: {trainer.state.global_step}, loss: {train_result.training_loss}")
    for entry in trainer.state.log_history:
        print(entry.get("step"), entry.get("reward"), entry.get("loss"))
    print(f"model saved to {trainer.args.output_dir}")

    trainer.push_to_hub(dataset_name="local/facts")
