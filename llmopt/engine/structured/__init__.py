"""Structured outputs with xgrammar: what a request asks its output to follow (request.py), grammars
compiled once per (kind, spec) and cached (compiler.py), and each sequence's place in its grammar, which
masks its logits rows and finds the tokens the grammar forces next (sequence_grammar.py)."""
