"""A tiny decoder for offline runs: random weights and a tokenizer trained here, in seconds.

As built, its completions are gibberish; it exists so the tests and the benchmarks exercise the
whole pipeline with no model hub, and as the from-scratch starting point `make demo` trains with
`genesys sft` and `genesys train`. Build one with `python -m genesys.generate.tiny_model DIR`, or
with a tokenizer trained on task text: `python -m genesys.generate.tiny_model DIR --tasks
arithmetic:count=2000 --split-digits` (one token per digit, so a model can learn digit by digit).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

# A ChatML-style template: each message framed by <|im_start|>role ... <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The layer shapes of real models, for speed measurements with random weights (`build_tiny_model(path, **SHAPES[name])`).
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "layers": 24,
        "heads": 14,
        "kv_heads": 2,
        "model_vocab_size": 151936,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "layers": 28,
        "heads": 12,
        "kv_heads": 2,
        "model_vocab_size": 151936,
    },
}
LABEL = "STAND-IN MODEL: random weights and a tokenizer trained on a few KB of text; its output is gibberish."


def default_corpus() -> list[str]:
    """Text to train the tokenizer on: the bundled task sets plus some reasoning-style phrases."""
    from genesys.tasks.samples import load_sample_file

    rows = load_sample_file("math_tasks.jsonl") + load_sample_file("code_tasks.jsonl")
    texts = [f"{row['prompt']}\n{row.get('gold_standard_solution') or ''}" for row in rows]
    texts.append(
        "<think>\nLet me think step by step. First, compute the value. Then check it.\n</think>\nThe answer is"
    )
    texts.append("Using the numbers, create an equation that equals the target. <answer>(1 + 2) * 3</answer>")
    texts.append("Think for 1000 tokens before giving a response. You are a helpful assistant.")
    return texts


def task_corpus(specs: Iterable[str]) -> list[str]:
    """Text to train a tokenizer on: the prompts and gold solutions of the `--tasks` specs, rendered
    with the chat template (so its framing tokens are learnt too)."""
    from genesys.tasks.sources import load_source

    texts = []
    for spec in specs:
        for row in load_source(spec).rows:
            solution = row.get("gold_standard_solution") or ""
            texts.append(
                f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n{solution}<|im_end|>\n"
            )
    return texts


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512, split_digits: bool = False):  # noqa: ANN201 - a transformers tokenizer
    """A byte-level BPE tokenizer trained on `corpus`, with the chat template and special tokens.
    `split_digits`: every digit is a token of its own (numbers are never merged)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate_size: int | None = None,
    vocab_size: int = 512,
    model_vocab_size: int | None = None,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    split_digits: bool = False,
    label: str = LABEL,
) -> Path:
    """Write a random-weight Qwen2-architecture model and its tokenizer to `path`; returns `path`.

    `vocab_size` is the tokenizer's; `model_vocab_size` pads the embedding and output layers to a
    realistic size (e.g. 151936) for speed measurements. By default the MLP is twice `hidden_size`
    wide and there are half as many key/value heads as heads. `corpus` is the tokenizer's training
    text (default: the bundled task sets); `split_digits` gives every digit a token of its own.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    path = Path(path)
    tokenizer = train_tokenizer(default_corpus() if corpus is None else corpus, vocab_size, split_digits)
    config = Qwen2Config(
        vocab_size=max(len(tokenizer), model_vocab_size or 0),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2),
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "README.md").write_text(label + "\n")
    return path


def parameter_count(path: str | Path) -> int:
    """The number of parameters of the model saved in `path` (tied weights counted once)."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description="Build a tiny decoder with random weights, offline.")
    parser.add_argument("path", help="directory to write the model and tokenizer to")
    parser.add_argument(
        "--tasks",
        nargs="+",
        metavar="SPEC",
        help="train the tokenizer on these task sources' prompts and gold solutions (default: the bundled samples)",
    )
    parser.add_argument("--split-digits", action="store_true", help="one token per digit")
    parser.add_argument("--vocab-size", type=int, default=512, help="tokenizer vocabulary (default 512)")
    parser.add_argument("--hidden-size", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    args = parser.parse_args()
    untrained = "TINY MODEL: random weights, trained by nothing yet; a tokenizer trained on the task text."
    build_tiny_model(
        args.path,
        hidden_size=args.hidden_size,
        layers=args.layers,
        heads=args.heads,
        vocab_size=args.vocab_size,
        seed=args.seed,
        corpus=task_corpus(args.tasks) if args.tasks else None,
        split_digits=args.split_digits,
        label=untrained if args.tasks else LABEL,
    )
    print(
        f"{untrained if args.tasks else LABEL}\n{parameter_count(args.path):,} parameters, written to {args.path}"
    )


if __name__ == "__main__":
    main()
