"""The pad token every tokenizer here gets: one distinct from EOS, so padding and the end of a response never
share an id. The model loader and the GGUF conversion of a bundled model both apply it."""

from __future__ import annotations

PAD_TOKEN = "<|pad|>"


def ensure_pad_token(tokenizer) -> bool:
    """Give `tokenizer` a pad token distinct from EOS; returns True if the vocabulary grew.

    A pad equal to EOS (SmolLM2 ships pad = eos = <|im_end|>) makes "this id is padding" and "this id ends the
    response" indistinguishable, so it is replaced too. Preference: an existing UNK token that differs from EOS
    (never produced by byte-level BPE, so a safe filler), else `<|pad|>`, added as a special token if missing.
    """
    eos = tokenizer.eos_token
    if tokenizer.pad_token is not None and tokenizer.pad_token != eos:
        return False
    if tokenizer.unk_token is not None and tokenizer.unk_token != eos:
        tokenizer.pad_token = tokenizer.unk_token
        return False
    before = len(tokenizer)
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return len(tokenizer) > before
