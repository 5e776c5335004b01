"""A stand-in model for offline runs: random weights and a tokenizer trained here, in seconds.

Its completions are gibberish; it exists so `make demo`, the tests and the benchmarks exercise the
whole pipeline with no model hub. Build one with `python -m genesys.generate.tiny_model DIR`.
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


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512):  # noqa: ANN201 - a transformers tokenizer
    """A byte-level BPE tokenizer trained on `corpus`, with the chat template and special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
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
) -> Path:
    """Write a random-weight Qwen2-architecture model and its tokenizer to `path`; returns `path`.

    `vocab_size` is the tokenizer's; `model_vocab_size` pads the embedding and output layers to a
    realistic size (e.g. 151936) for speed measurements. By default the MLP is twice `hidden_size`
    wide and there are half as many key/value heads as heads.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    path = Path(path)
    tokenizer = train_tokenizer(default_corpus() if corpus is None else corpus, vocab_size)
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
    (path / "README.md").write_text(LABEL + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the offline stand-in model (random weights).")
    parser.add_argument("path", help="directory to write the model and tokenizer to")
    args = parser.parse_args()
    build_tiny_model(args.path)
    print(f"{LABEL}\nwritten to {args.path}")


if __name__ == "__main__":
    main()
