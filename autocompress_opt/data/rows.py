"""One row of a user's table (a JSONL line, a parquet or ``datasets`` row) as the text of one document.

:class:`RowReader` turns a row (a mapping of field to value) into the document's text, the same
way for every kind of file, so that a JSONL file and the same rows in parquet give the same
documents:

============================================  =============================================================
the row holds (first match, or ``fields``)    the document
============================================  =============================================================
``text`` or ``content`` (a string)            that string
``messages``: ``[{"role", "content"}, ...]``  a chat (OpenAI format)
``conversations``: ``[{"from", "value"}]``    a chat (ShareGPT format: ``human``/``gpt``/``system``/...)
``prompt`` and ``completion``                 the two joined (strings), or one chat (lists of messages)
named ``fields`` (``#field=instruction,out``) their values joined by a newline, in the order named;
                                              a field holding a list of messages is a chat
============================================  =============================================================

A ``null`` or missing field contributes nothing (never the string ``"null"``); a row with no text at
all is skipped and counted. A chat document's stored text (:meth:`RowReader.text`) is the canonical
JSON of its messages as ``{"role", "content"}`` pairs, so its digest and its role do not depend on
the file's format; it is rendered for a model by :mod:`~autocompress_opt.data.chat`.
Everything here raises :class:`~autocompress_opt.errors.ConfigError` with one line naming the file,
the row (line) and the field, and what would be valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autocompress_opt.errors import ConfigError

__all__ = ["CHAT_KINDS", "TEXT_FIELDS", "RowReader", "chat_messages"]

TEXT_FIELDS = ("text", "content")  # a plain text field, tried in this order when no field is named
CHAT_KINDS = ("messages", "conversations")  # OpenAI and ShareGPT chat fields
PAIR_FIELDS = ("prompt", "completion")
# ShareGPT's speaker names → the chat roles every template knows.
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "function_call": "assistant",
    "observation": "tool",
}


def chat_messages(text: str) -> list[dict[str, str]]:
    """The ``{"role", "content"}`` messages of a chat document's stored text."""
    return list(json.loads(text))


@dataclass(frozen=True)
class RowReader:
    """How a file's rows become documents: ``fields`` named by the user (``#field=a,b``) or, when
    empty, the first of the layouts in the module doc that the file's first row with text matches.

    ``where`` names the file in messages (``rows.jsonl``); a row is named by ``row_label`` (``line
    12``, ``row 12``)."""

    where: str
    fields: tuple[str, ...] = ()

    def choose(self, columns: Sequence[str], row_label: str = "", *, schema: bool = True) -> RowReader:
        """This reader with its fields fixed from the file's ``columns`` (its schema, or with
        ``schema=False`` its first row's keys): named fields must be among a schema's columns (a
        JSONL row may lack an optional one); unnamed, the first layout present."""
        if self.fields and not schema:
            return self
        if self.fields:
            missing = [f for f in self.fields if f not in columns]
            if missing:
                raise ConfigError(
                    f"{self.where}{_at(row_label)} has no field {missing[0]!r}; its fields: {', '.join(columns)} "
                    f"(name them with #field=a,b)"
                )
            return self
        for name in (*TEXT_FIELDS, *CHAT_KINDS):
            if name in columns:
                return RowReader(self.where, (name,))
        if all(p in columns for p in PAIR_FIELDS):
            return RowReader(self.where, PAIR_FIELDS)
        raise ConfigError(
            f"{self.where}{_at(row_label)} has no text field ({', '.join(TEXT_FIELDS)}), chat "
            f"({', '.join(CHAT_KINDS)}) or prompt/completion pair; its fields: {', '.join(columns) or '(none)'}; "
            f"name the text with #field=NAME[,NAME...] (e.g. #field=instruction,output)"
        )

    def text(self, row: Mapping[str, Any], row_label: str) -> tuple[str, bool] | None:
        """The document text of ``row`` and whether it is a chat (None: the row holds no text);
        raises for a value that is neither text, null nor a chat."""
        if not isinstance(row, Mapping):
            raise ConfigError(
                f"{self.where} {row_label}: a row must be a JSON object {{field: value}}, got {type(row).__name__}"
            )
        parts: list[str | list[dict[str, str]]] = []
        for name in self.fields:
            value = row.get(name)
            if value is None or value == "" or value == []:
                continue
            if isinstance(value, str):
                parts.append(value)
            elif isinstance(value, bool) or not isinstance(value, (int, float, list)):
                raise ConfigError(
                    f"{self.where} {row_label}: field {name!r} holds {type(value).__name__} {_short(value)}; "
                    "valid: a string, null, or a list of chat messages ({role, content} or {from, value})"
                )
            elif isinstance(value, list):
                parts.append(_messages(value, self.where, row_label, name))
            else:
                parts.append(str(value))
        if not parts:
            return None
        chats = [p for p in parts if isinstance(p, list)]
        if chats:
            if len(chats) != len(parts):
                raise ConfigError(
                    f"{self.where} {row_label}: fields {', '.join(self.fields)} mix chat messages with plain text; "
                    "name either the chat fields or the text fields"
                )
            return json.dumps([m for chat in chats for m in chat], ensure_ascii=False, separators=(",", ":")), True
        return _join([p for p in parts if isinstance(p, str)]), False


def _join(parts: Sequence[str]) -> str:
    """Parts joined by a newline, or directly where one side already ends or begins with whitespace
    (a completion written as ``" Paris."`` after its prompt)."""
    out = parts[0]
    for part in parts[1:]:
        out += part if out[-1:].isspace() or part[:1].isspace() else "\n" + part
    return out


def _messages(value: list[Any], where: str, row_label: str, name: str) -> list[dict[str, str]]:
    """OpenAI (``role``/``content``) or ShareGPT (``from``/``value``) messages → ``{"role", "content"}``."""
    out = []
    for i, message in enumerate(value):
        if isinstance(message, Mapping) and "role" in message:
            role, content = message.get("role"), message.get("content")
        elif isinstance(message, Mapping) and "from" in message:
            role, content = _SHAREGPT_ROLES.get(str(message.get("from")).lower()), message.get("value")
            if role is None:
                raise ConfigError(
                    f"{where} {row_label}: field {name!r} message {i} is from {message.get('from')!r}; "
                    f"valid speakers: {', '.join(sorted(_SHAREGPT_ROLES))}"
                )
        else:
            raise ConfigError(
                f"{where} {row_label}: field {name!r} item {i} is {_short(message)}; valid: a chat message "
                '{"role": ..., "content": ...} (OpenAI) or {"from": ..., "value": ...} (ShareGPT), or a string field'
            )
        if content is None:
            content = ""
        if not isinstance(role, str) or not isinstance(content, str):
            raise ConfigError(
                f"{where} {row_label}: field {name!r} message {i} needs a string role and content, "
                f"got {_short(message)}"
            )
        out.append({"role": role, "content": content})
    return out


def _at(row_label: str) -> str:
    return f" ({row_label})" if row_label else ""


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
