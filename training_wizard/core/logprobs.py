"""Per-token log-probabilities and entropy from logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch


# Floats of (rows x T x V) float32 work space per chunk: about 64 MB, whatever the batch and vocabulary.
_CHUNK_ELEMENTS = 1 << 24


def _row_chunks(logits: torch.Tensor) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))


def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token] for each position, without keeping a (B, T, V) log-softmax.

    logits: (B, T, V) float; tokens: (B, T) long -> (B, T) float32.
    The temperature must be the sampling temperature: the ratio compares training-style logprobs of the same
    distribution that generated the tokens (the RLOO blog post, "recompute old logprobs with a forward pass").
    Computed in float32 so bf16 logits do not lose the small differences the ratio depends on, a chunk of rows at
    a time (about 64 MB of float32 each). The chunks come from `split` and are joined with `cat`, whose backward
    writes each chunk's gradient once; indexing rows one by one would make the backward fill a full (B, T, V)
    zero gradient per row.
    """
    return torch.cat([picked for _, picked, _ in _chunked_logprobs(logits, tokens, temperature)])


def _chunked_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """Per chunk of rows: (float32 scaled logits, logprobs of `tokens`, logsumexp), chunks from `split`."""
    size = _row_chunks(logits)
    for part, ids in zip(logits.split(size), tokens.split(size)):
        scaled = part.float() if temperature == 1.0 else part.float() / temperature  # float32 logits: no copy
        log_z = torch.logsumexp(scaled, dim=-1)
        yield scaled, scaled.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - log_z, log_z


@dataclass
class TokenLogprobs:
    """What the update needs from a micro-batch's policy logits, so the logits themselves need not outlive the
    forward pass. logprobs: (B, T) float32 with gradient; entropy: (B, T) float32, detached."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


def logprobs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> TokenLogprobs:
    """`selective_logprobs` and the entropy of softmax(logits / temperature), in one pass over each chunk, sharing
    its logsumexp.

    The update used to keep the (B, T, V) logits alive through the backward to take the entropy afterwards;
    here the entropy is taken from the chunk already in hand, so the logits are freed as soon as the backward
    has used them. The entropy is non-finite at a position exactly when one of its logits is (a -inf logit
    gives 0 x -inf), which makes it the update's finiteness check of the logits as well.
    """
    picked, entropies = [], []
    for scaled, chunk_logprobs, log_z in _chunked_logprobs(logits, tokens, temperature):
        picked.append(chunk_logprobs)
        with torch.no_grad():
            values, log_z = scaled.detach(), log_z.detach()
            weighted = (values - log_z.unsqueeze(-1)).exp_().mul_(values)  # p * logit, one work tensor
            entropies.append(log_z - weighted.sum(-1))
            del weighted
    return TokenLogprobs(torch.cat(picked), torch.cat(entropies))


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, tokens: torch.Tensor,
                  temperature: float = 1.0) -> TokenLogprobs:
    """`logprobs_and_entropy` of the logits `head(hidden)`, without ever holding those logits whole.

    hidden: (B, T, H) final hidden states at the positions that predict `tokens` (B, T); head: the model's output
    layer. The (B, T, V) logits are made a chunk of rows at a time into one work buffer, reduced to each row's
    logprob, logsumexp and entropy, and dropped; the backward makes each chunk's logits again (one more product
    with the output layer) and turns them in place into the chunk's gradient. So neither pass allocates
    anything of (B, T, V) size: with a large vocabulary those tensors are most of the memory an update pass
    touches, and each fresh one costs a page fault per 4 KiB on first use (`bench/revisions.py` measures it).
    The values are those of `logprobs_and_entropy` up to float rounding (the products have other shapes).
    """
    batch, width = tokens.shape
    logprobs, entropy = _HeadLogprobs.apply(hidden.reshape(batch * width, -1), head.weight, head.bias,
                                            tokens.reshape(-1), temperature)
    return TokenLogprobs(logprobs.view(batch, width), entropy.view(batch, width))


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                  buffer: torch.Tensor) -> torch.Tensor:
    """float32 (rows, V) logits / temperature of `hidden`'s rows, written into `buffer` where the dtypes allow."""
    rows = hidden.shape[0]
    if hidden.dtype == weight.dtype == torch.float32 and not torch.is_autocast_enabled(hidden.device.type):
        logits = torch.mm(hidden, weight.t(), out=buffer[:rows])
        if bias is not None:
            logits.add_(bias)
    else:  # bfloat16 weights or autocast: the product in their dtype, then float32
        logits = buffer[:rows].copy_(torch.nn.functional.linear(hidden, weight, bias))
    return logits if temperature == 1.0 else logits.div_(temperature)


class _HeadLogprobs(torch.autograd.Function):
    """(N, H) hidden, output layer (V, H) weight and (V,) bias, (N,) tokens -> (N,) logprobs, (N,) entropy."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature):
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // weight.shape[0])
        buffer = hidden.new_empty((min(rows_per_chunk, hidden.shape[0]), weight.shape[0]), dtype=torch.float32)
        work = torch.empty_like(buffer)
        logprobs, entropy, log_z = (hidden.new_empty(hidden.shape[0], dtype=torch.float32) for _ in range(3))
        for start in range(0, hidden.shape[0], rows_per_chunk):
            part = slice(start, start + rows_per_chunk)
            logits = _chunk_logits(hidden[part], weight, bias, temperature, buffer)
            exp = work[: logits.shape[0]]
            # log sum exp(logits) = max + log sum exp(logits - max); an infinite max counts as 0 so that a row of
            # -inf gives -inf (and +inf gives nan), as torch.logsumexp does
            top = logits.amax(-1, keepdim=True)
            top = torch.where(top.isinf(), torch.zeros_like(top), top)
            total = torch.sub(logits, top, out=exp).exp_().sum(-1)
            log_z[part] = chunk_log_z = total.log() + top.squeeze(-1)
            logprobs[part] = logits.gather(-1, tokens[part].unsqueeze(-1)).squeeze(-1) - chunk_log_z
            # entropy = log Z - sum p * logit, with p = exp(logit - max) / total
            entropy[part] = chunk_log_z - exp.mul_(logits).sum(-1) / total
        ctx.save_for_backward(hidden, weight, bias, tokens, log_z)
        ctx.temperature, ctx.rows_per_chunk = temperature, rows_per_chunk
        ctx.autocast = torch.is_autocast_enabled(hidden.device.type)
        ctx.autocast_dtype = torch.get_autocast_dtype(hidden.device.type)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, bias, tokens, log_z = ctx.saved_tensors
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if wants_bias else None
        rows = ctx.rows_per_chunk
        buffer = hidden.new_empty((min(rows, hidden.shape[0]), weight.shape[0]), dtype=torch.float32)
        in_place = hidden.dtype == weight.dtype == torch.float32 and not ctx.autocast
        # the forward's autocast state again (autograd may run the backward on a thread without it)
        with torch.autocast(hidden.device.type, dtype=ctx.autocast_dtype, enabled=ctx.autocast):
            for start in range(0, hidden.shape[0], rows):
                part = slice(start, start + rows)
                grad_out = grad_logprobs[part].float().unsqueeze(-1)
                # d logprob / d logit = onehot(token) - softmax, times the incoming gradient, in place
                grad = _chunk_logits(hidden[part], weight, bias, ctx.temperature, buffer)
                grad.sub_(log_z[part].unsqueeze(-1)).exp_().mul_(-grad_out)
                grad.scatter_add_(-1, tokens[part].unsqueeze(-1), grad_out)
                if ctx.temperature != 1.0:
                    grad.div_(ctx.temperature)
                if wants_bias:
                    grad_bias += grad.sum(0)
                grad = grad.to(weight.dtype)
                if in_place:  # float32 throughout: the products go straight into the gradients
                    if wants_hidden:
                        torch.mm(grad, weight, out=grad_hidden[part])
                    if wants_weight:
                        grad_weight.addmm_(grad.t(), hidden[part])
                    continue
                if wants_hidden:
                    grad_hidden[part] = grad @ weight
                if wants_weight:  # a (V, H) product in the weight's dtype, summed in float32
                    grad_weight += (grad.t() @ hidden[part]).float()
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None)
