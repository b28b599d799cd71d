"""Write tests/fixtures/trl_distill.json: what TRL 1.16's DistillationTrainer loss (`_chunked_divergence_loss`, called
as `DistillationTrainer._compute_loss` calls it) gives on seeded random tensors, with its gradients.

TRL is no dependency of training-wizard: run this with a separate environment that has TRL 1.16, for example

    python3 -m venv /tmp/trlvenv
    /tmp/trlvenv/bin/pip install torch==2.13.0 "trl==1.16.*"
    /tmp/trlvenv/bin/python scripts/trl_distill_fixture.py

tests/unit/test_distillation_loss.py then checks that `training_wizard.core.distillation.generalized_jsd` gives the
same loss, entropy and gradients. The tensors come from a fixed seed, so running the script again writes the same
file (on the same torch build).

Each case (beta in 0, 0.5, 1; temperature 1 and 0.7) calls TRL twice on float32 tensors:
- with hidden states (B=2, T=5, H=7) and lm_head weights (V=11, H): the loss (mean over the masked tokens and
  divided by `num_items_in_batch`), the summed student entropy, and the gradients of the mean loss with respect to
  the student's hidden states and lm_head weight;
- with the student's logits as hidden states and an identity lm_head (H = V), which makes TRL's hidden-state
  gradient the gradient with respect to the student's logits.
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import torch
from trl.trainer.distillation_trainer import _chunked_divergence_loss

BATCH, STEPS, VOCAB, HIDDEN = 2, 5, 11, 7
SEED = 1234
NUM_ITEMS = 13  # a global token count larger than this batch's, as under gradient accumulation
BETAS = (0.0, 0.5, 1.0)
TEMPERATURES = (1.0, 0.7)
# Position (0, 2) stands for an environment token inside a completion; the second row ends in padding.
MASK = [[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]]
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "trl_distill.json"


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)

    def normal(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    return {
        "student_hidden": normal(BATCH, STEPS, HIDDEN),
        "teacher_hidden": normal(BATCH, STEPS, HIDDEN),
        "student_weight": normal(VOCAB, HIDDEN, scale=0.8),
        "teacher_weight": normal(VOCAB, HIDDEN, scale=0.8),
        "mask": torch.tensor(MASK, dtype=torch.long),
    }


def trl_on_hidden_states(tensors: dict[str, torch.Tensor], beta: float, temperature: float) -> dict:
    student_hidden = tensors["student_hidden"].clone().requires_grad_(True)
    student_weight = tensors["student_weight"].clone().requires_grad_(True)
    args = (student_hidden, tensors["teacher_hidden"], student_weight, tensors["teacher_weight"], tensors["mask"], beta)
    loss, entropy_sum, n_valid = _chunked_divergence_loss(*args, temperature=temperature)
    loss.backward()
    loss_num_items, _, _ = _chunked_divergence_loss(*args, num_items_in_batch=NUM_ITEMS, temperature=temperature)
    return {
        "loss": loss.item(),
        "loss_num_items": loss_num_items.item(),
        "entropy_sum": entropy_sum.item(),
        "n_valid": int(n_valid),
        "grad_student_hidden": student_hidden.grad.tolist(),
        "grad_student_weight": student_weight.grad.tolist(),
    }


def trl_on_logits(tensors: dict[str, torch.Tensor], beta: float, temperature: float) -> dict:
    student_logits = (tensors["student_hidden"] @ tensors["student_weight"].T).requires_grad_(True)
    teacher_logits = tensors["teacher_hidden"] @ tensors["teacher_weight"].T
    identity = torch.eye(VOCAB)
    loss, _, _ = _chunked_divergence_loss(
        student_logits, teacher_logits, identity, identity, tensors["mask"], beta, temperature=temperature
    )
    loss.backward()
    return {"loss_from_logits": loss.item(), "grad_student_logits": student_logits.grad.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    out = parser.parse_args().out
    torch.manual_seed(SEED)
    tensors = inputs()
    cases = []
    for beta in BETAS:
        for temperature in TEMPERATURES:
            case = {"beta": beta, "temperature": temperature}
            case.update(trl_on_hidden_states(tensors, beta, temperature))
            case.update(trl_on_logits(tensors, beta, temperature))
            cases.append(case)
    fixture = {
        "trl_version": version("trl"),
        "torch_version": torch.__version__,
        "num_items_in_batch": NUM_ITEMS,
        "inputs": {name: tensor.tolist() for name, tensor in tensors.items()},
        "cases": cases,
    }
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
