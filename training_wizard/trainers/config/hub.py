"""The Hugging Face Hub upload of a run's final model: the on-policy configs' push_to_hub and hub_model_id
(`HubArguments`), which a recipe reads at the end of its run (recipes/base.py) and TRL's `trainer.push_to_hub()`
(trl/results.py) calls too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from training_wizard.errors import UserError
from training_wizard.trainers.config.run import RunConfig

UPLOAD_SKIPPED = ("checkpoints/*", "_*", ".*")  # resumable state stays local, as transformers leaves checkpoint-*


def hub_unavailable(token: str | None) -> str | None:
    """Why nothing can be uploaded now (offline, or no token), or None."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        return "the Hugging Face Hub is offline here (HF_HUB_OFFLINE=1)"
    if token is None and get_token() is None:
        return "no Hugging Face token (set HF_TOKEN or run `hf auth login`)"
    return None


class HubArguments(RunConfig):
    """TRL's Hub keys on the on-policy configs. A recipe with push_to_hub uploads its final model at the end
    (recipes/base.py); a TRL script reads `args.push_to_hub` and calls `trainer.push_to_hub()` itself."""

    push_to_hub: bool = Field(
        False, description="Upload the final model (output_dir/model: weights, tokenizer, model card) to the Hugging "
        "Face Hub once, at the end of the run (TRL's push_to_hub; checkpoints stay local). A recipe checks at start, "
        "--dry-run included, that the Hub is online and a token is set (HF_TOKEN or `hf auth login`).")
    hub_model_id: str | None = Field(
        None, description="The Hub repository push_to_hub uploads to, 'user/name' or 'name' (TRL's hub_model_id); "
        "unset: the name of output_dir's folder. Created when missing.")


def hub_repository(config) -> str:
    """The repository a run of `config` pushes to: hub_model_id, else output_dir's folder name (transformers')."""
    return getattr(config, "hub_model_id", None) or Path(config.output_dir).absolute().name


def upload_to_hub(folder: Path, repo_id: str, label: str, token: str | None = None, private: bool | None = None,
                  **upload_options: Any):
    """Create `repo_id` when missing and upload `folder` (checkpoints and hidden files left out): (the repository's
    id, upload_folder's result). Offline, without a token or when the Hub refuses: one line (UserError) starting
    with `label`, saying the model stays in `folder`."""
    reason = hub_unavailable(token)
    if reason is not None:
        raise UserError(f"{label}: {reason}; nothing was uploaded; the model is saved in {folder}")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        return repo, api.upload_folder(repo_id=repo, folder_path=folder, ignore_patterns=list(UPLOAD_SKIPPED),
                                       **upload_options)
    except (HfHubHTTPError, OSError) as exc:
        raise UserError(f"{label}: the upload to {repo_id} failed ({str(exc).splitlines()[0]}); the model is "
                        f"saved in {folder}") from None
