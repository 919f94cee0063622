"""Chat templates: a model's Jinja `chat_template`, rendered exactly as `transformers` renders it.

`apply_chat_template` compiles the template in a sandboxed Jinja environment with
`trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension, a `tojson` that does not escape HTML,
`raise_exception` and `strftime_now`, and passes the tokenizer's named special tokens
(`bos_token`, `eos_token`, ...) as variables; the token ids are then the tokenizer's encoding of
the rendered text without added special tokens. This module does the same with jinja2 and a
`tokenizers.Tokenizer`, so no `transformers` is needed at training or serving time.

ChatML is built in for kiln-trained tokenizers (`add_chat_tokens` adds its two special tokens).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path

from kiln.platform.errors import ConfigError, InputError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
BUILTIN_TEMPLATES = {"chatml": CHATML}
BUILTIN_END_OF_TURN = {"chatml": "<|im_end|>"}
# markers templates use to close a turn (ChatML, Llama 3, Gemma, Phi-3, Llama 2)
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>")
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@lru_cache(maxsize=16)
def _compile(source: str):
    """The template compiled in the environment `transformers` uses (chat_template_utils.py).

    Cached by source: the serving endpoint renders the same template for every request."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for transformers' masks;
        # it renders its body unchanged, and kiln finds assistant spans by rendering prefixes.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(
                lineno
            )

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ConfigError(f"chat_template: not a valid Jinja template ({e})") from None


def token_text(value) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A Jinja chat template plus the special-token variables it is rendered with."""

    def __init__(
        self,
        source: str,
        special_tokens: dict[str, str] | None = None,
        end_of_turn: str | None = None,
        name: str = "custom",
    ) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.name = name
        # The token that ends an assistant turn (generation stops on it).
        self.end_of_turn = end_of_turn or self.special_tokens.get("eos_token")

    @cached_property
    def _compiled(self):
        return _compile(self.source)

    @classmethod
    def builtin(cls, name: str, special_tokens: dict[str, str] | None = None) -> ChatTemplate:
        if name not in BUILTIN_TEMPLATES:
            raise ConfigError(
                f"chat_template: {name!r} is not a built-in template "
                f"(expected one of {sorted(BUILTIN_TEMPLATES)} or a tokenizer directory)"
            )
        return cls(BUILTIN_TEMPLATES[name], special_tokens, BUILTIN_END_OF_TURN[name], name)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> ChatTemplate:
        """The template of a HF model/tokenizer directory (`chat_template.jinja` or
        `tokenizer_config.json`'s `chat_template`, the `default` one when several are named)."""
        d = Path(path)
        config_file = d / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        specials = {
            k: t for k in SPECIAL_TOKEN_NAMES if (t := token_text(config.get(k))) is not None
        }
        source = config.get("chat_template")
        if (d / "chat_template.jinja").is_file():
            source = (d / "chat_template.jinja").read_text()
        if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str) or not source:
            raise InputError(
                f"{path}: no chat_template in tokenizer_config.json or chat_template.jinja"
            )
        end = "<|im_end|>" if "<|im_end|>" in source else None
        return cls(source, specials, end, name=str(path))

    @classmethod
    def resolve(cls, spec: str, special_tokens: dict[str, str] | None = None) -> ChatTemplate:
        """A built-in name (`chatml`) or a directory holding a tokenizer_config.json."""
        if spec in BUILTIN_TEMPLATES:
            return cls.builtin(spec, special_tokens)
        if os.path.isdir(spec):
            return cls.from_pretrained(spec)
        raise ConfigError(
            f"chat_template: {spec!r} is neither a built-in ({sorted(BUILTIN_TEMPLATES)}) "
            "nor a directory with tokenizer_config.json"
        )

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
        **kwargs,
    ) -> str:
        """The conversation as text, as `apply_chat_template(..., tokenize=False)` renders it;
        `tools` (OpenAI's `{"type": "function", "function": {...}}` entries) as its `tools=`."""
        variables = {**self.special_tokens, **kwargs}
        return self._compiled.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )


def load_chat_config(tokenizer_dir: str | None) -> tuple[str | None, dict[str, str]]:
    """(chat_template or None, special tokens by name) from tokenizer_config.json."""
    path = os.path.join(tokenizer_dir or "", "tokenizer_config.json")
    if not tokenizer_dir or not os.path.exists(path):
        return None, {}
    with open(path) as f:
        cfg = json.load(f)
    special = {k: t for k in SPECIAL_TOKEN_NAMES if (t := token_text(cfg.get(k))) is not None}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return (template if isinstance(template, str) else None), special


def reads_tools(template: str | None) -> bool:
    """Whether a template shows tool definitions itself (reads the `tools` variable)."""
    return template is not None and "tools" in template


def end_of_turn_markers(template: str | None, special: dict[str, str]) -> list[str]:
    """The strings that close an assistant turn under this template."""
    source = template or CHATML
    found = [m for m in END_OF_TURN_MARKERS if m in source]
    eos = special.get("eos_token")
    if template is not None and eos and eos not in found:
        found.append(eos)
    return found


def add_chat_tokens(tokenizer, template: ChatTemplate) -> list[str]:
    """Add the template's control tokens (ChatML's) to a kiln-trained tokenizer as special tokens.

    Returns the tokens that were missing. The model's vocabulary must cover the new ids.
    """
    wanted = [t for t in CHATML_TOKENS if t in template.source]
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    missing = [t for t in wanted if t not in vocab]
    if missing:
        tokenizer.add_special_tokens(missing)
    return missing
