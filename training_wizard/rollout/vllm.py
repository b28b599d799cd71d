"""vLLM as the generation backend (`use_vllm = true`): colocated in the training process, or a separate server.

Both return the tokens vLLM sampled and the logprob it gave each (`logprobs_mode = "processed_logprobs"`: after
temperature and any truncation, i.e. the distribution the token was really drawn from). The rollout's "old"
logprobs still come from the training forward pass; the gap between the two is what the importance-sampling
correction (core/importance_sampling.py) weighs.

Randomness stays keyed per row: every request carries the row's sampling key as its vLLM seed, so a prompt gets
the same completions whatever batch or process it is sampled in (tests/with_vllm check this).

Weights: the engine starts from the policy's config with dummy weights (`load_format = "dummy"`) and gets the
policy's weights pushed in memory before its first sample and after every update (`push_weights`, one function).
A LoRA policy is pushed with each adapter folded into its base weight (new tensors; the trained weights are not
touched), or, where vLLM's LoRA layers can take it, as its adapter alone (rollout/vllm_lora.py, `vllm_lora_push`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator

import torch

from training_wizard.errors import UserError
from training_wizard.rollout.backends import GenerationBackend
from training_wizard.rollout.generation import GenerationParams, Generated
from training_wizard.rollout.vllm_lora import LoraPush, adapter_push

# model -> its state_dict's (name, tensor) pairs, each tensor whole (Collectives.whole_state for sharded weights)
WholeState = Callable[[torch.nn.Module], Iterator[tuple[str, torch.Tensor]]]


def local_state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The state of a model whose weights are whole on this process."""
    return iter(model.state_dict().items())

# Head sizes the CPU build's attention kernels take (vLLM's CPU attention backend); others fail at start-up with
# "Unsupported CPU attention configuration".
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def vllm_missing(reason: str) -> UserError:
    return UserError(f"training.use_vllm: vLLM is not installed ({reason}); `pip install -e .[vllm]` on a GPU "
                     "machine, or `bash scripts/setup_vllm.sh` for vLLM's CPU build (docs/vllm.md)")


def check_vllm_installed() -> None:
    """One line saying how to install vLLM, unless it is installed (found without importing it, which takes
    seconds: a dry run checks it too)."""
    if importlib.util.find_spec("vllm") is None:
        raise vllm_missing("no module named 'vllm'")


def import_vllm():
    """The vllm package, or one line saying how to install it."""
    # In-process engine core: the trainer drives the engine directly (no engine subprocess to reach the weights).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # leave thread placement to the trainer
    try:
        import vllm
    except ImportError as exc:
        raise vllm_missing(str(exc)) from None
    return vllm


def on_cpu() -> bool:
    return not torch.cuda.is_available()


def head_size(config) -> int:
    explicit = getattr(config, "head_dim", None)
    return int(explicit) if explicit else config.hidden_size // config.num_attention_heads


def check_engine_can_run(model_config, sleep_mode: bool) -> None:
    """One-line refusals of what vLLM's CPU build cannot do."""
    if not on_cpu():
        return
    size = head_size(model_config)
    if size not in CPU_HEAD_SIZES:
        raise UserError(f"training.use_vllm: the model's attention head size is {size}; vLLM's CPU build runs only "
                        f"head sizes {', '.join(map(str, CPU_HEAD_SIZES))} (use the decode loop: use_vllm = false)")
    if sleep_mode:
        raise UserError("training.vllm_enable_sleep_mode: vLLM has no sleep mode on CPU; set it to false")


def sampling_params(vllm, params: GenerationParams, seed: int, options: dict[str, Any]):
    """vLLM SamplingParams for one row: our stop tokens exactly (the model's own EOS list is ignored: the trainer
    already put it in), the row's sampling key as seed, and the sampled token's logprob."""
    stop = list(params.stop_token_ids) or None
    return vllm.SamplingParams(
        n=1, max_tokens=params.max_new_tokens, temperature=params.temperature, seed=int(seed), logprobs=0,
        stop_token_ids=stop, ignore_eos=True, detokenize=False, skip_special_tokens=False, **options,
    )


def prompt_token_lists(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded (B, P) prompts as lists of their real token ids."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]


def to_generated(rows: list[tuple[list[int], list[float]]], pad_token_id: int, device) -> Generated:
    """(token ids, logprobs) per row -> Generated (B, T), T the longest row, padded with pad / logprob 0."""
    width = max((len(tokens) for tokens, _ in rows), default=0)
    tokens = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (ids, values) in enumerate(rows):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        logprobs[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return Generated(tokens.to(device), logprobs.to(device))


def sampled_rows(outputs) -> list[tuple[list[int], list[float]]]:
    """Token ids and the logprob of each sampled token from vLLM RequestOutputs."""
    rows = []
    for output in outputs:
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        values = [float(entry[token].logprob) for entry, token in zip(completion.logprobs or [], ids)]
        rows.append((ids, values))
    return rows


# ------------------------------------------------------------------------------------------------- weights
def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def checkpoint_weights(model: torch.nn.Module, whole: WholeState = local_state,
                       fold_adapters: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of `model` under the names of its Hugging Face checkpoint, LoRA adapters folded in (or, with
    `fold_adapters=False`, the base weights alone: what an engine applying the adapter itself takes).

    `whole(module)` gives the module's state with each tensor whole, one at a time (ZeRO-3 and FSDP2 shards are
    gathered: `Collectives.whole_state`); every process must call this alike. A peft LoRA linear layer stores
    `<layer>.base_layer.weight` and its adapters' `lora_A` / `lora_B`; the checkpoint name is `<layer>.weight`,
    holding W + (B A) * scaling, peft's own delta (transposed for fan_in_fan_out layers), as new tensors. Adapters
    that cannot be folded that way (DoRA, LoRA bias, non-linear bases) are refused.
    """
    from training_wizard.rollout.adapters import foldable_lora_layers

    hf_model = base_model(model)
    lora = {}
    if hf_model is not model and fold_adapters:
        layers = foldable_lora_layers(model)
        if layers is None:
            raise UserError("model.lora: under use_vllm only plain LoRA adapters on linear layers can be pushed to "
                            "vLLM (no DoRA, LoRA bias or adapters on other layers)")
        names = {id(module): name for name, module in hf_model.named_modules()}
        lora = {names[id(layer)]: layer for layer in layers}
    with torch.no_grad():
        state = dict(whole(hf_model))
        for name, tensor in state.items():
            if ".lora_" in name:
                continue
            if ".base_layer." in name:
                owner, leaf = name.split(".base_layer.", 1)
                name = f"{owner}.{leaf}"
                if owner in lora and leaf == "weight":
                    tensor = tensor + _lora_delta(lora[owner], owner, state).to(tensor.dtype)
            yield name, tensor.detach()


def _lora_delta(layer, owner: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum over the layer's active adapters of (B A) * scaling, from whole tensors (peft's `get_delta_weight`)."""
    total = None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        delta = state[f"{owner}.lora_B.{adapter}.weight"] @ state[f"{owner}.lora_A.{adapter}.weight"]
        delta = (delta.T if layer.fan_in_fan_out else delta) * layer.scaling[adapter]
        total = delta if total is None else total + delta
    return total if total is not None else torch.zeros(())


def engine_dtype(model: torch.nn.Module) -> str:
    dtype = next(base_model(model).parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def write_model_config(model: torch.nn.Module, folder: str) -> None:
    """The policy's transformers config (no weights): what a dummy-weight engine is built from."""
    config = base_model(model).config
    config.save_pretrained(folder)


class _EngineOwnWeights(GenerationBackend):
    """A backend sampling from its own copy of the policy's weights: stale after every update (and before the
    first push), pushed by `push_weights` before the next sample. `whole` makes sharded weights whole for the push
    (`checkpoint_weights`)."""

    def __init__(self, whole: WholeState):
        self.whole = whole
        self._stale = True

    def weights_changed(self) -> None:
        self._stale = True

    def sync_weights(self, model) -> None:
        if self._stale:
            self.push_weights(model)
            self._stale = False

    def push_weights(self, model: torch.nn.Module) -> None:
        raise NotImplementedError


class VLLMColocateBackend(_EngineOwnWeights):
    """One vLLM engine inside this training process (vllm_mode = "colocate")."""

    name = "vLLM (colocate)"

    def __init__(self, model: torch.nn.Module, *, max_model_len: int, seed: int, gpu_memory_utilization: float,
                 tensor_parallel_size: int, sleep_mode: bool, world_size: int, sampling_options: dict[str, Any],
                 whole: WholeState = local_state, lora_push: LoraPush = "auto"):
        super().__init__(whole)  # dummy weights until the first push
        vllm = import_vllm()
        check_engine_can_run(base_model(model).config, sleep_mode)
        self._vllm = vllm
        # None: every push sends the whole (merged) weights
        self.adapter = adapter_push(model, lora_push, server=False, sleep_mode=sleep_mode, cpu=on_cpu())
        lora_arguments = self.adapter.engine_arguments() if self.adapter is not None else {}
        with tempfile.TemporaryDirectory(prefix="training-wizard-vllm-") as folder:
            write_model_config(model, folder)
            self.engine = vllm.LLM(**self._engine_arguments(folder, model, max_model_len, seed, gpu_memory_utilization,
                                                            tensor_parallel_size, sleep_mode, world_size),
                                   **lora_arguments)
        self.sleep_mode = sleep_mode
        self.sampling_options = sampling_options

    @staticmethod
    def _engine_arguments(folder, model, max_model_len, seed, gpu_memory_utilization, tensor_parallel_size,
                          sleep_mode, world_size) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            model=folder, load_format="dummy", skip_tokenizer_init=True, dtype=engine_dtype(model),
            max_model_len=max_model_len, seed=seed, logprobs_mode="processed_logprobs",
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            enable_sleep_mode=sleep_mode, enforce_eager=on_cpu(), enable_prefix_caching=False,
        )
        if world_size > 1:  # every training process runs its own engine in the torch.distributed world it is in
            kwargs["distributed_executor_backend"] = "external_launcher"
        return kwargs

    def sample(self, model, prompt_ids, prompt_mask, params, row_seeds, sharded=False, all_finished=None):
        requests = [{"prompt_token_ids": ids} for ids in prompt_token_lists(prompt_ids, prompt_mask)]
        per_row = [sampling_params(self._vllm, params, seed, self.sampling_options) for seed in row_seeds]
        adapter = self.adapter.request if self.adapter is not None else None
        outputs = self.engine.generate(requests, per_row, use_tqdm=False, lora_request=adapter)
        if self.sleep_mode:
            self.engine.sleep(level=2)  # free weights and KV cache for the update; the next push brings them back
        return to_generated(sampled_rows(outputs), params.pad_token_id, prompt_ids.device)

    def push_weights(self, model: torch.nn.Module) -> None:
        """Load the policy's current weights into the engine, in memory (vLLM's in-place `reload_weights`), or
        only its adapter where the engine applies it (`self.adapter`)."""
        if self.sleep_mode:
            self.engine.wake_up(tags=["weights"])

        def push_base() -> None:
            self._reload(checkpoint_weights(model, self.whole, fold_adapters=False))

        if self.adapter is not None and not self.adapter.push(self.engine, model, self.whole, push_base):
            self.adapter = None  # vLLM refused the adapter under "auto": merged pushes from here on
        if self.adapter is None:
            self._reload(checkpoint_weights(model, self.whole))
        self.engine.reset_prefix_cache()
        if self.sleep_mode:
            self.engine.wake_up(tags=["kv_cache"])

    def _reload(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.engine.collective_rpc("reload_weights",
                                   kwargs={"weights_iterator": list(weights), "is_checkpoint_format": True})


class VLLMServerBackend(_EngineOwnWeights):
    """A `training-wizard vllm-serve` process reached over HTTP (vllm_mode = "server"). Every training process
    sends its own rows; the main process pushes the weights after each update (`push` says whether this process
    does) and the caller's `barrier` makes the others wait for it."""

    name = "vLLM (server)"

    def __init__(self, model: torch.nn.Module, *, base_url: str, timeout: float, push: bool, barrier,
                 sampling_options: dict[str, Any], whole: WholeState = local_state):
        super().__init__(whole)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.push = push
        self.barrier = barrier
        self.sampling_options = sampling_options
        info = self._wait_until_up()
        check_same_model(info, base_model(model).config, self.base_url)

    def _wait_until_up(self) -> dict[str, Any]:
        import time

        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._call("GET", "/health", timeout=min(5.0, self.timeout))
            except UserError:
                if time.monotonic() >= deadline:
                    raise UserError(f"training.vllm_server_base_url: no vLLM server answered at {self.base_url} within "
                                    f"{self.timeout:g} s (start one with `training-wizard vllm-serve --model ...`)") from None
                time.sleep(0.5)

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json",
              timeout: float | None = None) -> dict[str, Any]:
        request = urllib.request.Request(self.base_url + path, data=body, method=method,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise UserError(f"training.vllm_server_base_url: the vLLM server at {self.base_url} answered {path} with "
                            f"HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"training.vllm_server_base_url: the vLLM server at {self.base_url} did not answer {path} "
                            f"({reason}; timeout {timeout or self.timeout:g} s)") from None

    def sample(self, model, prompt_ids, prompt_mask, params, row_seeds, sharded=False, all_finished=None):
        payload = {
            "prompts": prompt_token_lists(prompt_ids, prompt_mask),
            "seeds": [int(seed) for seed in row_seeds],
            "max_tokens": params.max_new_tokens, "temperature": params.temperature,
            "stop_token_ids": list(params.stop_token_ids), "options": self.sampling_options,
            # the first id again under the earlier protocol's key, for a server of an earlier version
            "stop_token_id": params.stop_token_ids[0] if params.stop_token_ids else None,
        }
        answer = self._call("POST", "/generate", json.dumps(payload).encode())
        rows = list(zip(answer["tokens"], answer["logprobs"]))
        return to_generated(rows, params.pad_token_id, prompt_ids.device)

    def push_weights(self, model: torch.nn.Module) -> None:
        """Send the policy's weights to the server as safetensors, a bounded batch of tensors per request. Every
        process goes through the weights (gathering sharded ones is collective); the pushing one sends them, and
        no process samples before they are in (the barrier)."""
        weights = checkpoint_weights(model, self.whole)
        if self.push:
            self._send(weights)
        else:
            for _ in weights:
                pass
        self.barrier()

    def _send(self, weights) -> None:
        from safetensors.torch import save

        batch: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in weights:
            batch[name] = tensor.contiguous().cpu()
            size += tensor.numel() * tensor.element_size()
            if size >= _PUSH_BYTES:
                self._call("POST", "/update_weights", save(batch), "application/octet-stream")
                batch, size = {}, 0
        if batch:
            self._call("POST", "/update_weights", save(batch), "application/octet-stream")
        self._call("POST", "/reset_prefix_cache", b"{}")


_PUSH_BYTES = 512 * 2**20  # tensors per weight-push request


# The config fields that must agree for the server's engine to take the policy's weights.
_SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "intermediate_size")


def check_same_model(info: dict[str, Any], config, base_url: str) -> None:
    served = info.get("config", {})
    ours = config.to_dict()
    differ = [f"{key} {served.get(key)!r} (server) vs {ours.get(key)!r} (policy)"
              for key in _SHAPE_FIELDS if key in ours and served.get(key) != ours.get(key)]
    if differ:
        raise UserError(f"training.vllm_server_base_url: the server at {base_url} serves another model "
                        f"({info.get('model')}): {'; '.join(differ)}")
