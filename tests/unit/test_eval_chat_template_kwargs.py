"""`training-wizard eval` renders prompts with the chat_template_kwargs the trained run used (TRL's name)."""

from __future__ import annotations

from training_wizard.recipes.evaluate import EvaluateRecipe
from training_wizard.rollout.chat_templates import HERMES
from training_wizard.testing import save_tiny_model

# Qwen3's switch: with enable_thinking false the template writes an empty thinking block after the generation prompt
THINKING_OFF = ("{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}"
                "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}")


def test_eval_gives_the_template_its_variables(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from training_wizard.rollout.prompts import EncodedPrompts

    rendered, encode = [], EncodedPrompts.from_rows.__func__

    def recording(cls, rows, tokenizer):
        encoded = encode(cls, rows, tokenizer)
        rendered.append(tokenizer.decode(encoded.input_ids[0]))
        return encoded

    monkeypatch.setattr(EncodedPrompts, "from_rows", classmethod(recording))

    folder = save_tiny_model(tmp_path / "thinking")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = HERMES + THINKING_OFF
    tokenizer.save_pretrained(folder)
    data = tmp_path / "held_out.jsonl"
    data.write_text('{"prompt": [{"role": "user", "content": "Hi."}]}\n', encoding="utf-8")
    rows = [{"prompt": [{"role": "user", "content": "Hi."}]}]
    for kwargs in (None, {"enable_thinking": False}):
        recipe = EvaluateRecipe.model_validate({
            "output_dir": str(tmp_path / "eval"), "prompts": {"data_files": str(data)},
            "candidate": {"pretrained_name": str(folder)}, "response_length": 2,
            "metrics": {"ends": {"spec_class": "training_wizard.specs.text_metrics.EosRewardSpec"}},
            "chat_template_kwargs": kwargs})
        recipe._completions(recipe.candidate, rows)
    without, with_kwargs = rendered
    assert with_kwargs == without + "<think>\n\n</think>\n\n"
