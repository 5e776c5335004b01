"""Turning a task into model input: messages, target lengths, chat templates, continuation prefixes."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from jinja2.exceptions import TemplateError

from genesys.config import PromptStyle
from genesys.errors import InputError


def build_messages(
    prompt: str, system_prompt: str | None = None, target_instruction: str | None = None
) -> list[dict[str, str]]:
    """The chat messages of one task: an optional system message (system prompt, then the target
    length instruction) and the task prompt as the user message."""
    system = "\n\n".join(part for part in (system_prompt, target_instruction) if part)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return messages


def pick_target_length(target_lengths: Sequence[int], task_key: str, seed: int) -> int:
    """One of `target_lengths` for a task, fixed by the task and the seed (stable across reruns)."""
    digest = hashlib.blake2b(f"{seed}\x00{task_key}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big")).choice(list(target_lengths))


def target_instruction(template: str, target_length: int) -> str:
    """The instruction that asks for `target_length` thinking tokens."""
    try:
        return template.format(target_length=target_length)
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(f"--target-length-prompt must only use the field {{target_length}}: {exc}") from None


def raw_text(messages: list[dict[str, str]]) -> str:
    """The messages' contents as plain text, for models used without a chat template."""
    return "\n\n".join(message["content"] for message in messages)


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    style: PromptStyle,
    tools: list[dict[str, Any]] | None = None,
    generation_prompt: bool = True,
) -> str:
    """The prompt text: the chat template applied to `messages` (and the `tools`' schemas, when given),
    or their raw text; then the prefix. Without `generation_prompt`, the conversation as it stands
    (no generation prompt, no prefix): what a later prompt that continues it starts with."""
    if style.chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise InputError(
                f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'this model')!r} has no chat template; "
                "pass --no-chat-template to use the task prompts as raw text"
            )
        try:
            text = tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
            )
        except TemplateError:
            if messages[0]["role"] != "system":
                raise
            # Templates without a system role (e.g. Gemma's): the system text leads the user message.
            text = tokenizer.apply_chat_template(
                merge_system_into_user(messages),
                tools=tools,
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
    else:
        text = raw_text(messages)
    return text + style.continuation_prefix if generation_prompt else text


def merge_system_into_user(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages with a leading system message folded into the first user message."""
    system, user, *rest = messages
    return [{"role": "user", "content": f"{system['content']}\n\n{user['content']}"}, *rest]


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    style: PromptStyle,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt token ids. A chat template writes its own special tokens, so none are added then."""
    text = render_text(tokenizer, messages, style, tools)
    return list(tokenizer(text, add_special_tokens=not style.chat_template)["input_ids"])
