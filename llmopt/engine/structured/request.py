"""What a request asks its output to follow: a JSON object, a JSON schema, a regex, one of a list of
strings, or an EBNF grammar. It is the cache key of the compiled grammar, so it holds text only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from llmopt.engine.structured.schema_support import unenforced_keyword

StructuredKind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """`spec`: json_schema the schema as JSON text; choice a JSON list of strings; regex and grammar
    (EBNF, as llama.cpp's GBNF) the text itself; json_object nothing."""

    kind: StructuredKind
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.kind != "json_object" and not self.spec:
            raise ValueError(f"a {self.kind} structured output needs a spec")

    @classmethod
    def json_schema(cls, schema: dict) -> StructuredOutput:
        """The schema as its one text form, checked while it is a dict (a ValueError naming a keyword
        xgrammar would compile without enforcing); xgrammar reads the text, nothing parses it again."""
        if found := unenforced_keyword(schema):
            keyword, where = found
            raise ValueError(
                f"the schema uses {keyword!r} (at {where}), which xgrammar does not enforce: the output "
                "could break the schema, so it is refused"
            )
        # Key order is kept: the grammar writes properties in the schema's order.
        return cls("json_schema", json.dumps(schema, ensure_ascii=False))

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutput:
        return cls("choice", json.dumps(choices, ensure_ascii=False))
