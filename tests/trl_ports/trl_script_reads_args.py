"""The lines of TRL 1.16's trl/scripts/grpo.py and rloo.py that read the config after it is built, with only the
import line changed: model_init_kwargs from trust_remote_code, the eval split only when eval_strategy is not "no",
train(resume_from_checkpoint=...), the save into output_dir and the Hub push when push_to_hub is set.

    python trl_script_reads_args.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


if __name__ == "__main__":
    model_name, output_dir = sys.argv[1], sys.argv[2]
    dataset = {"train": Dataset.from_list([{"prompt": f"Fact {i}."} for i in range(4)]),
               "test": Dataset.from_list([{"prompt": "Eval fact."}])}
    training_args = GRPOConfig(output_dir=output_dir, max_steps=1, per_device_train_batch_size=4, num_generations=4,
                               max_completion_length=4, eval_steps=1, push_to_hub=True, hub_model_id="me/facts")

    model_init_kwargs = dict(revision="main", trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=None, dtype=None)
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs

    trainer = GRPOTrainer(
        model=model_name,
        reward_funcs=[reward_len],
        args=training_args,
        train_dataset=dataset["train"],
        eval_dataset=dataset["test"] if training_args.eval_strategy != "no" else None,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name="local/facts")
        print(f"pushed to {trainer.hub_model_id}")
