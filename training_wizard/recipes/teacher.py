"""What a recipe with a `[teacher_model]` checks at start and on --dry-run, before any model loads: the teacher's
folder holds a model it can load, and its tokenizer is the student's (one line naming [teacher_model] otherwise).
The distillation recipe's teacher and an RL recipe's (`distillation_coef`) are checked alike."""

from __future__ import annotations

import json

from training_wizard.errors import UserError
from training_wizard.specs.model import TransformerSpec


def check_teacher(student: TransformerSpec, teacher: TransformerSpec) -> None:
    check_teacher_loadable(teacher)
    check_same_tokenizer(student, teacher)


def check_teacher_loadable(spec: TransformerSpec) -> None:
    """The teacher's folder is a model folder with safetensors weights, or a LoRA adapter folder whose base model
    resolves (what `load_causal_lm` reads), without loading any weights."""
    folder = spec.resolved_path()
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise UserError(f"teacher_model.pretrained_name: '{folder}' is a LoRA adapter without "
                            "base_model_name_or_path")
        base_spec = spec.model_copy(update={"pretrained_name": base, "lora": None})
        base_spec._key = spec._key
        return check_teacher_loadable(base_spec)
    if not (folder / "config.json").is_file():
        raise UserError(f"teacher_model.pretrained_name: folder '{folder}' has no config.json; expected a Hugging "
                        "Face model folder or a LoRA run's model/ folder")
    if not any(folder.glob("*.safetensors")):
        raise UserError(f"teacher_model.pretrained_name: folder '{folder}' has no *.safetensors weights; "
                        "training-wizard loads safetensors only")


def check_same_tokenizer(student: TransformerSpec, teacher: TransformerSpec) -> None:
    """The divergence compares the two models token by token: the teacher's vocabulary (tokens and their ids) must
    be the student's."""
    mine, theirs = student.load_tokenizer().get_vocab(), teacher.load_tokenizer().get_vocab()
    if mine != theirs:
        differ = sorted({token for token, index in (set(mine.items()) ^ set(theirs.items()))})
        raise UserError(f"teacher_model: its tokenizer is not the student's ([model]): {len(theirs)} tokens against "
                        f"{len(mine)}, {len(differ)} token(s) missing or with another id (e.g. {differ[:3]}); "
                        "distillation needs the student's tokenizer")
