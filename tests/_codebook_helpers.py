"""Shared test helpers for the codebook/data/reward tests: a tiny local tokenizer (no hub downloads)."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "Let me think step by step. The answer is \\boxed{42}.",
    "We compute 1/2 + 1/4 = 3/4, so the result is \\frac{3}{4}.",
    "Find all x such that x^2 - 5x + 6 = 0. The roots are 2 and 3.",
]


def tiny_tokenizer_dir(folder: Path, vocab_size: int = 300) -> Path:
    """Train a byte-level BPE on a few sentences and save it as a transformers tokenizer directory.

    Byte-level BPE encodes any text and decodes it back exactly, like the policies' tokenizers;
    its merges are few, so token counts are close to byte counts, which tests can reason about.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder
