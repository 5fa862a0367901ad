"""Speculative decoding: propose k tokens cheaply, verify them in one forward of the target model.

Proposers: `ngram` (prompt lookup: the tokens that followed the latest earlier occurrence of the
context's last n tokens) and `draft` (a smaller or cheaper model with its own paged KV cache, proposing
autoregressively). Verification keeps the target's distribution exactly: greedy accepts while the
proposal equals the target's argmax; sampling accepts token x with probability min(1, p(x)/q(x)), on the
first rejection samples from norm(max(p - q, 0)), and adds a bonus token when all k are accepted.
"""
