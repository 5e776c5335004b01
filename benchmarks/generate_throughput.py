"""Tokens/s of the transformers backend against a plain `model.generate` loop, same prompts, same run.

Both sides sample the same prompts (rendered with the chat template) with the same batch size and
settings; the plain loop takes the prompts in their given order and keeps nothing but the tokens.
The backend also sorts by length, records per-token logprobs and builds completions. Prints both
rates and their ratio (goal: >= 1.0x, the pipeline adds nothing).

    python benchmarks/generate_throughput.py                      # stand-in tiny model, CPU
    python benchmarks/generate_throughput.py --hidden 1536 --layers 28 --heads 12 --vocab 151936 \
        --device cuda --dtype bfloat16 --batch-size 64 --prompts 256 --max-tokens 256   # Qwen2.5-1.5B-sized, random weights
    python benchmarks/generate_throughput.py --model PATH        # an existing model
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch


def plain_generate_loop(model, tokenizer, prompt_ids: list[list[int]], *, batch_size: int, max_tokens: int, device: str) -> int:
    """The baseline: batches in the given order, left padding, one `model.generate` call each; returns tokens made."""
    tokens = 0
    stop = tokenizer.eos_token_id
    for start in range(0, len(prompt_ids), batch_size):
        batch = tokenizer.pad({"input_ids": prompt_ids[start : start + batch_size]}, padding=True, return_tensors="pt").to(device)
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=stop)
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            tokens += next((k + 1 for k, t in enumerate(row) if t == stop), len(row))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model path (default: build a random-weight model of the given size)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, help="pad the model's vocabulary to this size (e.g. 151936, as Qwen2.5)")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=2, help="alternating timed rounds per side (best kept)")
    args = parser.parse_args()

    from genesys.generate.backend import GenerationRequest, PromptStyle, SamplingConfig, iterate
    from genesys.generate.hf import TransformersBackend
    from genesys.generate.prompts import build_messages, render_ids
    from genesys.generate.tiny_model import build_tiny_model
    from genesys.tasks.samples import load_sample_file

    model_path = args.model or build_tiny_model(
        tempfile.mkdtemp() + "/model", hidden_size=args.hidden, layers=args.layers, heads=args.heads, model_vocab_size=args.vocab
    )
    sampling = SamplingConfig(n=1, max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0)
    style = PromptStyle()
    # In this thread, as the plain loop: two threads running torch in one process slow each other down.
    backend = TransformersBackend(str(model_path), style, batch_size=args.batch_size, device=args.device, dtype=args.dtype, worker_thread=False)
    # A realistic mix of prompt lengths: the bundled tasks, shuffled, repeated up to --prompts.
    tasks = load_sample_file("math_tasks.jsonl") + load_sample_file("code_tasks.jsonl")
    random.Random(0).shuffle(tasks)
    messages = [build_messages(tasks[i % len(tasks)]["prompt"]) for i in range(args.prompts)]
    requests = [GenerationRequest(f"t{i}", m, [0], seed=i, sampling=sampling) for i, m in enumerate(messages)]
    prompt_ids = [render_ids(backend.tokenizer, m, style) for m in messages]

    def run_backend() -> int:
        return sum(len(c.completion_ids) for r in iterate(backend.generate(requests)) for c in r.completions)

    def run_plain() -> int:
        return plain_generate_loop(backend.model, backend.tokenizer, prompt_ids, batch_size=args.batch_size, max_tokens=args.max_tokens, device=args.device)

    run_plain(), run_backend()  # warm-up
    # Best of alternating rounds, by wall clock and by this process's CPU time (steadier on a
    # machine shared with other work; on an idle machine the two agree).
    names = ("plain model.generate loop", "genesys transformers backend")
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    for _ in range(args.repeats):
        for name, fn in zip(names, (run_plain, run_backend)):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            started, started_cpu = time.perf_counter(), time.process_time()
            tokens = fn()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            wall[name] = max(wall[name], tokens / (time.perf_counter() - started))
            cpu[name] = max(cpu[name], tokens / (time.process_time() - started_cpu))
    config = backend.model.config
    print(f"model: hidden={config.hidden_size} layers={config.num_hidden_layers} vocab={config.vocab_size} on {args.device} ({args.dtype})")
    print(f"prompts={args.prompts} batch_size={args.batch_size} max_tokens={args.max_tokens} torch threads={torch.get_num_threads()}")
    for name in reversed(names):
        print(f"{name:32s} {wall[name]:10,.1f} tokens/s wall   {cpu[name]:10,.1f} tokens/CPU-s")
    print(
        f"ratio backend / plain: {wall[names[1]] / wall[names[0]]:.2f}x wall, "
        f"{cpu[names[1]] / cpu[names[0]]:.2f}x CPU time (goal >= 1.0x)"
    )


if __name__ == "__main__":
    main()
