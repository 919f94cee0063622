"""A row's prompt: a Jinja template over its fields, as plain text or as chat messages rendered
with the model's chat template (kiln.text, as `transformers` renders it)."""

from __future__ import annotations

from functools import cached_property

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kiln.curator.generate.config import GenerateConfig
from kiln.platform.errors import ConfigError
from kiln.text.chat_template import ChatTemplate


class PromptError(ValueError):
    """This row cannot be rendered (a field the template names is missing): a row failure."""


_ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _compile(source: str, field: str) -> jinja2.Template:
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"generate.{field}: not a valid Jinja template ({e.message})") from None


class PromptBuilder:
    """Renders each row's prompt text; chat prompts through `chat_template`."""

    def __init__(self, cfg: GenerateConfig, chat_template: ChatTemplate | None = None) -> None:
        self.cfg = cfg
        self.chat_template = chat_template
        if cfg.messages is not None and chat_template is None:
            raise ConfigError(
                "generate.messages: the model has no chat template (set generate.chat_template)"
            )

    @cached_property
    def _templates(self) -> list[tuple[str | None, jinja2.Template]]:
        if self.cfg.prompt is not None:
            return [(None, _compile(self.cfg.prompt, "prompt"))]
        return [
            (m.role, _compile(m.content, f"messages.{i}.content"))
            for i, m in enumerate(self.cfg.messages or [])
        ]

    def render(self, row: dict) -> str:
        """The prompt text of `row`; raises PromptError when the row lacks a field."""
        try:
            parts = [(role, t.render(**row)) for role, t in self._templates]
        except jinja2.UndefinedError as e:
            raise PromptError(f"prompt template: {e.message}") from None
        if self.cfg.prompt is not None:
            return parts[0][1]
        messages = [{"role": role, "content": text} for role, text in parts]
        return self.chat_template.render(messages, add_generation_prompt=True)  # type: ignore[union-attr]
