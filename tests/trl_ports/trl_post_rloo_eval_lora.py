"""RLOO with an evaluation set and a LoRA adapter (peft_config), as TRL's examples/scripts/rloo.py runs it, then
the metrics read back by TRL's names from `trainer.state.log_history`.

    python trl_post_rloo_eval_lora.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset
from peft import LoraConfig

from training_wizard import RLOOConfig, RLOOTrainer


def unique_letters(completions, **kwargs):
    """More distinct letters in the reply score higher."""
    return [float(len(set(completion[0]["content"]))) for completion in completions]


if __name__ == "__main__":
    model_name, output_dir = sys.argv[1], sys.argv[2]
    rows = [{"prompt": [{"role": "user", "content": f"Describe a {word}."}]} for word in ("cat", "tree", "boat")]
    train_dataset = Dataset.from_list(rows + [{"prompt": [{"role": "user", "content": "Describe a moon."}]}])
    eval_dataset = Dataset.from_list(rows[:2])
    training_args = RLOOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=2,
                               max_completion_length=8, num_iterations=1, eval_strategy="steps", eval_steps=1,
                               logging_steps=1, learning_rate=1e-3)
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = RLOOTrainer(model=model_name, reward_funcs=unique_letters, args=training_args,
                          train_dataset=train_dataset, eval_dataset=eval_dataset, peft_config=peft_config)
    trainer.train()

    train_logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    eval_logs = [entry for entry in trainer.state.log_history if "eval_reward" in entry]
    for entry in train_logs:
        print(f"step {entry['step']}: reward {entry['reward']:.3f} +- {entry['reward_std']:.3f}, "
              f"kl {entry['kl']:.4f}, entropy {entry['entropy']:.3f}, "
              f"length {entry['completions/mean_length']:.1f}, clipped {entry['clip_ratio/region_mean']:.2f}")
    for entry in eval_logs:
        print(f"step {entry['step']}: eval reward {entry['eval_reward']:.3f}")
    trainer.model.print_trainable_parameters()
    trainer.save_model(training_args.output_dir)
