"""Loading a checkpoint never unpickles arbitrary objects; trust_remote_code stays off by default; canary secrets
never reach run outputs."""

import os
import sys

from training_wizard.checkpoint import write_manifest
from training_wizard.specs.model import TransformerSpec

from reliability_helpers import make_recipe, run_cli

MARKER = "pwned-marker"


class Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling this creates the marker file


def test_malicious_pickle_in_checkpoint_is_refused(tmp_path, tiny_model_dir):
    import torch

    recipe = make_recipe(tmp_path, tiny_model_dir, "run", extra="")
    child = run_cli([recipe, "training.total_episodes=16"], tmp_path / "logs" / "train")
    assert child.code == 0, child.stderr()[-2000:]
    folder = tmp_path / "run" / "checkpoints" / "step-2"
    marker = tmp_path / MARKER
    torch.save({"state": {}, "param_groups": [Payload(str(marker))]}, folder / "optimizer.pt")
    torch.save(Payload(str(marker)), folder / "model" / "pytorch_model.bin")  # never read: safetensors only
    write_manifest(folder, 2)  # a "valid" manifest: the attacker controls the whole folder
    child = run_cli([recipe, "training.total_episodes=24", f"resume_from_checkpoint={folder}"], tmp_path / "logs" / "r")
    lines = [line for line in child.stderr().splitlines() if line.strip()]
    assert child.code == 2 and not marker.exists()
    assert lines[-1].startswith("error: ") and "optimizer.pt is not plain tensor data" in lines[-1]
    assert "weights_only" in lines[-1] and "Traceback" not in child.stderr()
    torch.load(folder / "optimizer.pt", weights_only=False)  # the payload is live: full unpickling runs it
    assert marker.exists()


def test_trust_remote_code_is_off_by_default():
    assert TransformerSpec(pretrained_name="some/model").trust_remote_code is False


SECRET_REWARD = '''
from training_wizard.specs.reward import RewardSpec


class SecretRewardSpec(RewardSpec):
    api_key: str
    service_token: str = ""

    def compute_reward(self, prompts, completions, **columns):
        return [float(len(c)) for c in completions]
'''
CANARIES = {"HF_TOKEN": "hf_CANARY1x9", "WANDB_API_KEY": "wandbCANARY2x9"}
RECIPE_CANARIES = ("sk-CANARY3x9", "tok-CANARY4x9")


def test_canary_secrets_appear_nowhere(tmp_path, tiny_model_dir):
    recipe = make_recipe(tmp_path, tiny_model_dir, "run")
    (tmp_path / "secret_reward.py").write_text(SECRET_REWARD)
    text = recipe.read_text().replace(
        'spec_class = "training_wizard.specs.reward.FunctionRewardSpec"\nfunction = "rel_rewards:distinct"',
        f'spec_class = "secret_reward.SecretRewardSpec"\napi_key = "{RECIPE_CANARIES[0]}"\n'
        f'service_token = "{RECIPE_CANARIES[1]}"')
    recipe.write_text(text)
    child = run_cli([recipe, "training.total_episodes=24", "training.save_steps=1"], tmp_path / "logs" / "run",
                    env=CANARIES)
    assert child.code == 0, child.stderr()[-2000:]
    assert os.environ.get("HF_TOKEN") != CANARIES["HF_TOKEN"]  # set in the child only
    outputs = [child.stdout().encode(), child.stderr().encode()]
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in files) and any(p.name == "optimizer.pt" for p in files)
    outputs += [p.read_bytes() for p in files]
    for canary in [*CANARIES.values(), *RECIPE_CANARIES]:
        assert not any(canary.encode() in blob for blob in outputs), canary
    assert "<redacted>" in (tmp_path / "run" / "resolved_config.toml").read_text()
    sys.modules.pop("secret_reward", None)
