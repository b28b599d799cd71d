"""A run's memory per device, planned before anything is loaded: arithmetic on a model's shape and the batch keys.

`plan_memory(MemoryFacts)` returns a `MemoryPlan`: named terms in bytes, each marked as held for the whole run or
alive only while one phase runs (sampling with its KV cache, or the update's forward and backward), and the key
that sets it. The peak is what is held plus the larger phase. `verdict(plan, budget)` says whether that fits and,
when it does not, the one key to change first: the largest term's knob that can still be turned.

Where the numbers come from (docs/performance.md, "Memory plan", says what is left out):
- parameters from config.json (`ModelShape.parameters`: embeddings, attention and MLP projections with their
  biases, RMSNorm weights, an untied output layer); a LoRA adapter adds r x (in + out) per adapted linear layer;
- AdamW keeps two moments per trained parameter in the parameter's dtype, gradients one value; DeepSpeed ZeRO
  stage 1 divides the moments by the processes, stage 2 the gradients too, stage 3 and FSDP the weights as well;
- saved activations per token and decoder layer of a Llama/Qwen2-style model over a sequence of L tokens, counted
  from what autograd keeps (the test counts them with saved-tensor hooks): 10 H + 4 I + 2 values, plus with SDPA
  the log-sum-exp per head and the padding mask's row (L), with eager attention its (heads x L) probabilities per
  token. Both keep the keys and values repeated to every head (transformers repeats them where a padding mask is
  given, as left-padded prompts always give). Activation checkpointing keeps each layer's input (H) and one
  layer's whole set while it is recomputed (Korthikanti et al. 2022 derive such terms for GPT-style layers);
- the output layer: `core/logprobs.py: head_logprobs` makes the logits of at most 2^24 values a chunk, in two
  float32 buffers, and only for the response positions (`rollout/scoring.py: last_positions`); where it cannot run
  (sharded or compiled models) the (tokens x V) logits, their float32 chunk and their gradient are held;
- the decode loop's KV cache holds prompt + completion positions from the start (`rollout/generation.py`
  preallocates them) for a chunk of `local_rollout_forward_batch_size` rows; vLLM (colocated) takes its share of
  the device instead;
- with LoRA the decode loop samples with each adapted layer's weight and its adapter folded into one new tensor
  (`rollout/adapters.py`): a copy of every adapted weight while sampling runs (not with `fold_lora_for_sampling =
  false`, nor where the model samples sharded: FSDP, and ZeRO-3 without `ds3_gather_for_generation`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from training_wizard.errors import UserError

# `core/logprobs.py`'s chunk of float32 logits (_CHUNK_ELEMENTS): the output layer's work buffers never grow past it.
LOGITS_CHUNK_ELEMENTS = 1 << 24
# Every linear layer of a Llama/Qwen2 decoder block, which LoRA's "all-linear" adapts (peft leaves the output layer).
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str, key: str = "--memory-budget") -> int:
    """'24GB' -> 24 x 10^9 bytes, '80GiB' -> 80 x 2^30, '512MB', '1.5TB', '1000' (bytes); else a UserError naming
    `key`."""
    match = _SIZE.match(str(text))
    if match is None or float(match.group(1)) <= 0:
        raise UserError(f"{key}: {text!r} is not a size; expected a positive number and a unit, e.g. 24GB, 512MB "
                        "or 80GiB")
    unit = (match.group(2) or "").lower().removesuffix("b")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(count: float) -> str:
    """Bytes in decimal units, three significant figures: 1.23 GB, 45.6 MB, 512 kB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a Llama/Qwen2-style decoder's config.json. `lm_head`: a causal LM's output layer
    (False for a sequence classifier, whose one-output head is counted as `labels` x hidden)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    tied: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head: bool = True
    labels: int = 0

    @classmethod
    def from_config(cls, config: dict, vocab: int | None = None) -> ModelShape:
        """From a config.json's dict (a multimodal config's `text_config`); `vocab` where the tokenizer grows the
        embeddings past `vocab_size`. A KeyError names what is missing."""
        config = config.get("text_config") or config
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        qwen = str(config.get("model_type", "")).startswith("qwen2")  # Qwen2: biases on q, k, v only
        bias = bool(config.get("attention_bias", False))
        return cls(hidden=config["hidden_size"], layers=config["num_hidden_layers"], heads=heads,
                   kv_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
                   vocab=max(config["vocab_size"], vocab or 0), intermediate=config["intermediate_size"],
                   tied=bool(config.get("tie_word_embeddings", False)), qkv_bias=qwen or bias, o_bias=bias,
                   mlp_bias=bool(config.get("mlp_bias", False)))

    def as_classifier(self, labels: int = 1) -> ModelShape:
        """This body with a `labels`-output head in place of the output layer (a reward or value model)."""
        return ModelShape(**{**self.__dict__, "lm_head": False, "labels": labels})

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder block."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_width, self.hidden, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def parameters(self) -> int:
        """Every parameter the model holds (the count `sum(p.numel())` gives)."""
        shapes = self.linear_shapes()
        block = sum(a * b for a, b in shapes.values()) + 2 * self.hidden  # two RMSNorm weights
        block += (self.qkv_bias and shapes["q_proj"][1] + 2 * self.kv_width) + (self.o_bias and self.hidden)
        block += self.mlp_bias and 2 * self.intermediate + self.hidden
        head = self.vocab * self.hidden if self.lm_head and not self.tied else self.labels * self.hidden
        return self.vocab * self.hidden + self.layers * block + self.hidden + head

    def lora_parameters(self, rank: int, targets: str | tuple[str, ...] | list[str]) -> int:
        """Parameters of a LoRA adapter of `rank` on `targets` ("all-linear" or module names, as peft's
        target_modules): r x (in + out) per adapted layer."""
        names = DECODER_LINEARS if targets == "all-linear" else tuple(targets)
        shapes = self.linear_shapes()
        total = self.layers * sum(rank * sum(shapes[name]) for name in names if name in shapes)
        if "lm_head" in names and self.lm_head:
            total += rank * (self.hidden + self.vocab)
        return total

    def lora_adapted_weights(self, targets: str | tuple[str, ...] | list[str]) -> int:
        """Weights of the linear layers a LoRA adapter on `targets` adapts: the size of the folded copies the
        decode loop makes of them while it samples (`rollout/adapters.py: adapters_folded`)."""
        names = DECODER_LINEARS if targets == "all-linear" else tuple(targets)
        shapes = self.linear_shapes()
        total = self.layers * sum(shapes[name][0] * shapes[name][1] for name in names if name in shapes)
        if "lm_head" in names and self.lm_head:
            total += self.hidden * self.vocab
        return total

    def activation_values(self, sequence: int, eager: bool, lora_rank: int = 0) -> int:
        """Values autograd keeps per token and decoder layer (float32 or the autocast dtype each), for a sequence
        of `sequence` tokens. A LoRA adapter on every linear layer keeps its rank-wide middle per layer, and the
        frozen RMSNorm weights need not keep the two normalised inputs they multiply (an upper bound for adapters
        on fewer layers)."""
        attention = self.heads * sequence if eager else self.heads + sequence  # probabilities | log-sum-exp, mask
        adapter = lora_rank * len(DECODER_LINEARS) - 2 * self.hidden if lora_rank else 0
        return 10 * self.hidden + 4 * self.intermediate + 2 + attention + adapter


@dataclass(frozen=True)
class MemoryFacts:
    """A run's model and batch facts, per process. Lengths in tokens; bytes per value of weights (4 float32, 2
    bfloat16) and of activations (2 under bf16/fp16 autocast or weights)."""

    policy: ModelShape
    weight_bytes: int = 4
    activation_bytes: int = 4
    lora_rank: int | None = None
    lora_targets: str | tuple[str, ...] = "all-linear"
    micro_batch_rows: int = 1
    max_tokens_per_micro_batch: int | None = None
    padding_free: bool = False
    rollout_rows: int = 1
    prompt_length: int = 1
    completion_length: int = 1
    gradient_checkpointing: bool = False
    eager_attention: bool = False
    reference: str = "copy"  # "copy" (a frozen model), "adapter" (LoRA disabled), "none"
    value_model: bool = False  # PPO: a classifier on the policy's body, trained beside it
    reward_model: ModelShape | None = None
    reward_weight_bytes: int = 4
    processes: int = 1
    sharding: str = "none"  # "none", "zero1", "zero2", "zero3", "fsdp"
    head_logprobs: bool = True  # the output layer a chunk at a time (not sharded, not compiled)
    vllm_share: float | None = None  # colocated vLLM's gpu_memory_utilization
    device_total: int | None = None
    runtime_bytes: int = 0  # what the process holds before any model: the runtime, libraries, allocator
    token_budget_key: bool = False  # the config has max_tokens_per_micro_batch
    fold_lora: bool = True  # the decode loop samples with folded copies of adapted weights (memory_report: folds_lora)

    @property
    def sequence(self) -> int:
        return self.prompt_length + self.completion_length

    def divisor(self, part: str) -> int:
        """How many processes share `part` ("weights", "gradients", "optimizer") under this sharding."""
        sharded = {"zero1": ("optimizer",), "zero2": ("optimizer", "gradients"),
                   "zero3": ("optimizer", "gradients", "weights"), "fsdp": ("optimizer", "gradients", "weights")}
        return self.processes if part in sharded.get(self.sharding, ()) else 1

    def trained_parameters(self) -> int:
        if self.lora_rank is None:
            return self.policy.parameters()
        return self.policy.lora_parameters(self.lora_rank, self.lora_targets)

    def update_tokens(self) -> int:
        """Tokens of one update micro-batch: its token budget (a row longer than the budget still runs whole),
        else rows x (prompt + completion)."""
        padded = self.micro_batch_rows * self.sequence
        if self.max_tokens_per_micro_batch is None:
            return padded
        return min(padded, max(self.max_tokens_per_micro_batch, self.sequence))


@dataclass(frozen=True)
class MemoryTerm:
    """One line of the plan. phase: "held" (the whole run), or the phase it lives in ("sampling", "rollout
    passes", "update"); knob: the key to change to shrink it, with a value, or None where no key does."""

    name: str
    bytes: int
    phase: str
    knob: str | None = None


PHASES = ("sampling", "rollout", "update")


@dataclass(frozen=True)
class MemoryPlan:
    terms: tuple[MemoryTerm, ...]

    def phase_total(self, phase: str) -> int:
        return sum(term.bytes for term in self.terms if term.phase == phase)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.phase_total)

    @property
    def total(self) -> int:
        """The peak: what is held for the whole run plus the largest phase (the phases run one after another)."""
        return self.phase_total("held") + self.phase_total(self.peak_phase)

    def first_knob(self) -> str | None:
        """The knob of the largest term that counts toward the peak and has one."""
        counted = [term for term in self.terms if term.phase in ("held", self.peak_phase) and term.knob]
        return max(counted, key=lambda term: term.bytes).knob if counted else None


@dataclass(frozen=True)
class Verdict:
    fits: bool
    budget: int
    knob: str | None  # None when it fits, or no key shrinks what is over


def verdict(plan: MemoryPlan, budget: int) -> Verdict:
    fits = plan.total <= budget
    return Verdict(fits, budget, None if fits else plan.first_knob())


def plan_memory(facts: MemoryFacts) -> MemoryPlan:
    """Every term of `facts`' run, per process (the module docstring says where each comes from)."""
    terms = [MemoryTerm("runtime", facts.runtime_bytes, "held"),
             *_held_models(facts), *_update_terms(facts), *_rollout_terms(facts)]
    return MemoryPlan(tuple(term for term in terms if term.bytes > 0))


def _lora_knob(facts: MemoryFacts) -> str | None:
    return "model.lora = { r = 16 }" if facts.lora_rank is None else None


def _held_models(facts: MemoryFacts) -> list[MemoryTerm]:
    """Weights of every model, the optimizer's moments, vLLM's share."""
    policy, width = facts.policy.parameters(), facts.weight_bytes
    trained = facts.trained_parameters()
    dtype_knob = 'training.dtype = "bfloat16"' if width == 4 else None
    terms = [MemoryTerm("policy weights", policy * width // facts.divisor("weights"), "held", dtype_knob),
             MemoryTerm("AdamW states",
                        2 * trained * width // facts.divisor("optimizer"), "held", _lora_knob(facts))]
    if facts.reference == "copy":
        terms.append(MemoryTerm("reference weights", policy * width // facts.divisor("weights"), "held",
                                _lora_knob(facts)))
    if facts.value_model:
        body = facts.policy.as_classifier()
        value_trained = body.parameters() if facts.lora_rank is None else trained + facts.policy.hidden
        state = body.parameters() * width // facts.divisor("weights")
        state += 2 * value_trained * width // facts.divisor("optimizer")
        terms.append(MemoryTerm("value model", state, "held", _lora_knob(facts)))
    if facts.reward_model is not None:
        terms.append(MemoryTerm("reward model weights", facts.reward_model.parameters() * facts.reward_weight_bytes,
                                "held", 'reward.dtype = "bfloat16"' if facts.reward_weight_bytes == 4 else None))
    if facts.vllm_share and facts.device_total:
        share = round(max(0.1, facts.vllm_share - 0.1), 2)
        terms.append(MemoryTerm("vLLM share",
                                int(facts.vllm_share * facts.device_total), "held",
                                f"training.vllm_gpu_memory_utilization = {share}"))
    return terms


def _batch_knob(facts: MemoryFacts, rows_key: str, rows: int) -> str | None:
    """Halve `rows_key` (a rows-per-pass key); at one row, halve the completion length."""
    if rows > 1:
        return f"training.{rows_key} = {rows // 2}"
    if facts.completion_length > 1:
        return f"training.response_length = {facts.completion_length // 2}"
    return None


def _activation_knob(facts: MemoryFacts) -> str | None:
    if not facts.gradient_checkpointing:
        return "training.gradient_checkpointing = true"
    tokens = facts.update_tokens()
    if facts.token_budget_key and tokens > facts.sequence:
        return f"training.max_tokens_per_micro_batch = {tokens // 2}"
    return _batch_knob(facts, "per_device_train_batch_size", facts.micro_batch_rows)


def _update_terms(facts: MemoryFacts) -> list[MemoryTerm]:
    """Gradients, saved activations and the output layer's work of one update micro-batch."""
    shape, tokens = facts.policy, facts.update_tokens()
    trained = facts.trained_parameters()
    gradients = trained * facts.weight_bytes // facts.divisor("gradients")
    per_layer = shape.activation_values(facts.sequence, facts.eager_attention, facts.lora_rank or 0)
    if facts.gradient_checkpointing:  # each layer's input kept, one layer's whole set while it is recomputed
        values = tokens * (shape.layers * shape.hidden + per_layer)
    else:
        values = tokens * shape.layers * per_layer
    values += tokens * (2 * shape.hidden + 2 * shape.head_dim)  # final norm, rotary tables
    models = 2 if facts.value_model else 1  # PPO's value model runs its own forward over the same tokens
    rows = max(1, tokens // facts.sequence)
    terms = [MemoryTerm("gradients", models * gradients, "update", _lora_knob(facts)),
             MemoryTerm("activations", models * values * facts.activation_bytes, "update",
                        _activation_knob(facts)),
             MemoryTerm("output layer", _logits_work(facts, rows * facts.completion_length,
                                                                   gradient=True), "update",
                        _batch_knob(facts, "per_device_train_batch_size", facts.micro_batch_rows))]
    if facts.activation_bytes < facts.weight_bytes:  # autocast keeps a low-precision copy of each trained weight
        terms.append(MemoryTerm("autocast copies", trained * facts.activation_bytes, "update"))
    return terms


def _logits_work(facts: MemoryFacts, positions: int, gradient: bool) -> int:
    """Bytes of the output layer's logits for `positions` response tokens: `head_logprobs`' two float32 chunk
    buffers, or (sharded, compiled) the whole logits, their float32 chunk and in the update their gradient."""
    vocab = facts.policy.vocab
    chunk = 4 * vocab * min(positions, max(1, LOGITS_CHUNK_ELEMENTS // vocab))
    if facts.head_logprobs:
        return 2 * chunk
    return positions * vocab * facts.activation_bytes * (2 if gradient else 1) + 2 * chunk


def _rollout_terms(facts: MemoryFacts) -> list[MemoryTerm]:
    """Sampling (the KV cache, the last position's logits) and the no-grad passes over a chunk of rows."""
    shape, rows = facts.policy, facts.rollout_rows
    knob = _batch_knob(facts, "local_rollout_forward_batch_size", rows)
    terms = []
    if facts.vllm_share is None:
        cache = rows * facts.sequence * shape.layers * 2 * shape.kv_width * facts.activation_bytes
        terms += [MemoryTerm("KV cache", cache, "sampling", knob),
                  MemoryTerm("decode logits", 3 * rows * shape.vocab * 4, "sampling", knob)]
        if facts.lora_rank is not None and facts.fold_lora:
            terms.append(MemoryTerm("folded LoRA weights",
                                    shape.lora_adapted_weights(facts.lora_targets) * facts.weight_bytes, "sampling",
                                    "training.fold_lora_for_sampling = false"))
    tokens = rows * facts.sequence
    # one layer at a time: the residual stream, the block's projections and the MLP's three intermediates
    values = tokens * (4 * shape.hidden + 2 * shape.kv_width + 3 * shape.intermediate)
    if facts.eager_attention:
        values += rows * shape.heads * facts.sequence**2
    work = values * facts.activation_bytes + _logits_work(facts, rows * facts.completion_length, gradient=False)
    return [*terms, MemoryTerm("no-grad forward", work, "rollout", knob)]
