"""Text ⇄ token ids for the front door and the HTTP load client: a local model folder's own
tokenizer (``tokenizer.json`` through the ``tokenizers`` library, local files only, never the
hub), or for the random-weight presets a small bundled byte-level BPE (see
``bundled_tokenizer.py``), with the chat template a folder's ``tokenizer_config.json`` (or
``chat_template.jinja``) gives.

The engine itself never sees text; this module is in the shared vocabulary so that every surface
(server, client, tests) reads a folder one way without importing the engine.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import ConfigError

BUNDLED_PATH = Path(__file__).parent / "data" / "tokenizer-bundled.json"
#: The bundled tokenizer's chat template: ChatML (Qwen2's format) over its special tokens.
BUNDLED_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BUNDLED_SPECIALS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")


@dataclass
class Tokenizer:
    """A loaded tokenizer. ``vocab_size``: the tokenizer's ids are ``[0, vocab_size)``;
    ``model_vocab_size``: the model's. ``source``: the folder, or "bundled".

    ``bundled``: the presets' stand-in. Random weights sample ids anywhere in the model's
    vocabulary; ids the bundled tokenizer lacks are shown as the text of ``id mod`` its regular
    ids (a stand-in: token counts are exact, the text is not; docs/serve.md)."""

    tok: Any  # tokenizers.Tokenizer
    name: str
    source: str
    model_vocab_size: int
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    bundled: bool = False
    special_ids: frozenset[int] = field(default_factory=frozenset)
    _compiled: Any = field(default=None, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with the tokenizer's BOS when ``add_special_tokens``)."""
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def _map(self, ids: Iterable[int]) -> list[int]:
        if not self.bundled:
            return list(ids)
        n = self.vocab_size
        k = len(BUNDLED_SPECIALS)
        return [i if 0 <= i < n else k + i % (n - k) for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(self._map(ids), skip_special_tokens=skip_special_tokens)

    def decoder(self) -> "IncrementalDecoder":
        """A decoder for one request's output stream (text deltas, UTF-8 safe)."""
        return IncrementalDecoder(self)

    def apply_chat_template(self, messages: list[dict[str, Any]], *,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for ``messages`` (``[{"role", "content": str}]``) through the chat
        template, as transformers renders it (a sandboxed Jinja2 environment with
        ``raise_exception``, ``tojson`` and ``strftime_now``). Raises ConfigError when the
        tokenizer has no template or the template refuses the messages."""
        if not self.chat_template:
            raise ConfigError(f"the tokenizer of {self.name} has no chat template "
                              "(tokenizer_config.json 'chat_template'): use /v1/completions")
        import jinja2

        try:
            tmpl = self._compiled
            if tmpl is None:
                tmpl = self._compiled = _jinja_env().from_string(self.chat_template)
            return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        except jinja2.TemplateError as e:
            raise ConfigError(f"the chat template of {self.name} refused the messages: {e}") from None


class IncrementalDecoder:
    """Turns one request's tokens into text deltas: a token that ends mid UTF-8 character yields
    "" until the character is complete (``tokenizers.decoders.DecodeStream``)."""

    def __init__(self, tk: Tokenizer) -> None:
        from tokenizers.decoders import DecodeStream

        self.tk = tk
        self._ds = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        tk = self.tk
        (tid,) = tk._map((token_id,)) if tk.bundled else (token_id,)
        try:
            out = self._ds.step(tk.tok, tid)
        except Exception:  # an id outside a folder tokenizer's vocabulary: no text for it
            return ""
        return out or ""


_ENV = None


def _jinja_env():
    global _ENV
    if _ENV is None:
        import datetime

        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        _ENV = env
    return _ENV


def _token_text(v: Any) -> str:
    # tokenizer_config.json writes special tokens as a string or as an AddedToken dict
    if isinstance(v, dict):
        return str(v.get("content", ""))
    return v if isinstance(v, str) else ""


def read_tokenizer_json(path: str) -> tuple[Any, Path]:
    """``(tokenizers.Tokenizer, the file)`` from a local ``tokenizer.json`` or a folder that
    holds one — the one reader of tokenizer files (the server and the HTTP load client). Local
    files only. Raises ConfigError naming the path: no such path, no tokenizer.json (a
    SentencePiece-only folder says how to convert it), a file the library cannot parse."""
    from tokenizers import Tokenizer as HFTokenizer

    where = Path(os.path.expanduser(path))
    file = where if where.is_file() else where / "tokenizer.json"
    folder = file.parent
    if not where.exists():
        raise ConfigError(f"tokenizer {str(path)!r}: no such file or folder")
    if not file.is_file():
        extra = (" (it has tokenizer.model, a SentencePiece file: save it as tokenizer.json "
                 "once with transformers' AutoTokenizer.save_pretrained)"
                 if (folder / "tokenizer.model").is_file() else "")
        raise ConfigError(f"tokenizer {str(path)!r}: {str(folder)!r} has no tokenizer.json"
                          f"{extra}; use token-id prompts or --tokenizer PATH")
    try:
        return HFTokenizer.from_file(str(file)), file
    except Exception as e:  # the Rust side raises plain Exception subclasses
        raise ConfigError(f"tokenizer {str(file)!r} cannot be read: {e}") from None


def load_tokenizer(model: str, model_vocab_size: int, path: str | None = None) -> Tokenizer:
    """The tokenizer for ``model`` (a preset name or a local folder), or the one at ``path``
    (a folder with ``tokenizer.json``, or the file itself) when given.

    A preset gets the bundled tokenizer; a folder its own ``tokenizer.json`` with the chat
    template and special tokens of its ``tokenizer_config.json`` (``chat_template.jinja``
    beside it wins, as in transformers ≥ 4.43). Local files only.

    Raises ConfigError naming the path when there is no ``tokenizer.json`` (a folder with only
    a SentencePiece ``tokenizer.model``: convert it once with transformers), it cannot be read
    or parsed, or its ids exceed the model's vocabulary.
    """
    from .presets import PRESETS

    if path is None and model in PRESETS:
        return _bundled(model, model_vocab_size)
    tok, file = read_tokenizer_json(path or model)
    folder = file.parent
    cfg: dict[str, Any] = {}
    cfg_file = folder / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{str(cfg_file)!r} cannot be read as JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"{str(cfg_file)!r} is not a JSON object")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        template = jinja_file.read_text()
    tk = Tokenizer(tok, name=folder.name, source=str(folder), model_vocab_size=model_vocab_size,
                   chat_template=template if isinstance(template, str) else None,
                   bos_token=_token_text(cfg.get("bos_token")),
                   eos_token=_token_text(cfg.get("eos_token")))
    if tk.vocab_size > model_vocab_size:
        # added tokens past the model's rows would be refused per request; say so once
        raise ConfigError(f"tokenizer {str(file)!r} has {tk.vocab_size} ids, the model "
                          f"{model_vocab_size}: they do not belong together")
    return tk


def _bundled(model: str, model_vocab_size: int) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    if not BUNDLED_PATH.is_file():
        raise ConfigError(f"the bundled tokenizer {str(BUNDLED_PATH)!r} is missing from this "
                          "install (reinstall gpuchef)")
    tok = HFTokenizer.from_file(str(BUNDLED_PATH))
    if tok.get_vocab_size(with_added_tokens=True) > model_vocab_size:
        raise ConfigError(f"the bundled tokenizer has more ids than {model}'s vocabulary "
                          f"({model_vocab_size})")
    specials = frozenset(tok.token_to_id(t) for t in BUNDLED_SPECIALS)
    return Tokenizer(tok, name=f"{model} (bundled byte-level BPE)", source="bundled",
                     model_vocab_size=model_vocab_size, chat_template=BUNDLED_CHAT_TEMPLATE,
                     bos_token="<s>", eos_token="</s>", bundled=True, special_ids=specials)
