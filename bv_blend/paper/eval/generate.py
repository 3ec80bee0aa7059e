"""Sampling with vLLM (GPU). Imported lazily: nothing else in bv_blend.eval needs vLLM."""

from __future__ import annotations

from collections.abc import Sequence

from bv_blend.paper.eval.suite import Conversation, GenerateFn


def vllm_generator(
    model: str,
    *,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_tokens: int = 3072,
    seed: int = 0,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
) -> GenerateFn:
    """A :data:`GenerateFn` over one ``vllm.LLM``: each conversation gets the model's chat template (as in
    training, where verl applies it) and ``n`` samples at the paper's temperature 0.6."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        seed=seed,
    )

    def generate(conversations: Sequence[Conversation], n: int) -> list[list[str]]:
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
        outputs = llm.chat(list(conversations), params, use_tqdm=True)
        return [[choice.text for choice in out.outputs] for out in outputs]

    return generate
