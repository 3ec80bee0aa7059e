"""fp32 against bf16 for the actor's update on this CPU: what a step of verl's CPU harness spends most of its time on.

Times what verl's FSDP actor does per micro-batch on a pretrained model (default SmolLM2-135M-Instruct, prepared
offline as the demo prepares it): a forward over prompt + response tokens, the log-probs of the taken tokens over the
whole vocabulary, a policy-gradient loss and its backward, in fp32 and with bf16 compute (FSDP's
``mixed_precision.param_dtype=bf16`` runs the layers in bf16), and prints the two side by side with their ratio and
the CPU's kind. bf16 is fast only where the CPU has AVX-512-BF16, and fastest with AMX (docs/cpu.md).

    python scripts/bench_dtype.py                         # SmolLM2, micro-batches of 16 x 112 tokens
    python scripts/bench_dtype.py --model DIR --tokens 256 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def one_update(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Seconds for a forward, the taken tokens' log-probs, a loss and the backward, in the model's dtype (FSDP's
    param_dtype casts the whole module, so its copy in that dtype is what the actor computes with)."""
    start = time.perf_counter()
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(logp * torch.randn_like(logp)).mean()  # advantages' stand-in: the cost does not depend on them
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help='"smollm2" (prepared offline) or a local HF causal LM folder')
    p.add_argument("--batch", type=int, default=16, help="sequences a micro-batch (the harness's gcd(16, rollouts))")
    p.add_argument("--tokens", type=int, default=112, help="prompt + response tokens, padded (~48 + 64)")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from instruments.machine import describe_cpu
    from instruments.run import pretrained

    folder = pretrained.prepare_smollm2() if a.model == "smollm2" else a.model
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.tokens), generator=torch.Generator().manual_seed(0))
    print(f"{describe_cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    times = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = model.to(dtype)  # in place: fp32 comes first
        one_update(model, ids)  # first use: oneDNN's kernels chosen and cached
        times[name] = statistics.median(one_update(model, ids) for _ in range(a.repeats))
        print(f"{name}: {times[name]:.2f} s a micro-batch of {a.batch} x {a.tokens} tokens (median of {a.repeats})")
    print(f"bf16 / fp32: {times['bf16'] / times['fp32']:.2f}x the time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
