"""Tiny offline building blocks for tests, benchmarks and docs: a byte-level BPE tokenizer with a chat template,
and small random Llama / Qwen2 models. Everything is built locally in about a second; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paraphrase the following sentence in your own words.",
    "A small model learns to write short and clear answers.",
    "Reinforcement learning from a reward improves language models online.",
    "She sells sea shells by the sea shore, and the shells are bright.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 and letters a b c d e f g h i j k l m n o p q r s t u v w x y z.",
    "You rewrite sentences. Keep the meaning, change the words.",
    "What is the capital of France? Paris is the capital of France.",
]


def build_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (PreTrainedTokenizerFast) with pad, EOS (<|im_end|>) and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_causal_lm(
    tokenizer, arch: str = "llama", hidden_size: int = 64, num_layers: int = 2, seed: int = 0, **config_overrides
):
    """A small random causal LM (Llama or Qwen2 config) sized to the tokenizer; `config_overrides` go to the
    config and replace its settings (for example attention_dropout, or num_attention_heads = 2 for a head size
    of 32, the smallest vLLM's CPU build runs)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    config = config_class(**{**settings, **config_overrides})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def build_sequence_classifier(tokenizer, hidden_size: int = 64, seed: int = 0):
    """A small random Llama sequence classifier with one label: a stand-in reward model."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(config)


def save_tiny_model(folder: str | Path, arch: str = "llama", seed: int = 0) -> Path:
    """Write a tiny causal LM and its tokenizer to `folder` (safetensors), loadable with from_pretrained."""
    folder = Path(folder)
    tokenizer = build_tokenizer()
    model = build_causal_lm(tokenizer, arch=arch, seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def scripted_backend(sample):
    """A generation backend that samples with `sample(model, prompt_ids, prompt_mask, params, seeds,
    all_finished=None) -> rollout.generation.Generated` over all rows at once: hand it to a trainer as
    `generation_backend=` to give it fixed completions."""
    from training_wizard.rollout.backends import GenerationBackend

    class ScriptedBackend(GenerationBackend):
        name = "scripted"
        samples_with_training_forward = True  # as the decode loop: logprobs come from the training model

        def sample(self, model, prompt_ids, prompt_mask, params, row_seeds, sharded=False, all_finished=None):
            return sample(model, prompt_ids, prompt_mask, params, row_seeds, all_finished)

    return ScriptedBackend()
