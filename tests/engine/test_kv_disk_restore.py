"""The KV disk tier on the real default model: more sessions than a small pool holds, each resumed for a
second turn. With the tier their prefixes come back from disk, and every greedy token is the one the
engine computes without it (and transformers' own); a corrupted block file is computed again, never
served; an engine closed and started again (a restart) finds the blocks its predecessor left."""

from __future__ import annotations

import pytest

from llmopt.engine.kv_block_file import file_name
from llmopt.engine.llm import LLM, CompletionOutput
from llmopt.engine.sampling_params import SamplingParams
from llmopt.engine.sequence import Sequence
from tests.conftest import PROMPTS

POOL = dict(num_kv_blocks=32, max_num_seqs=1)  # 512 tokens: one session's ~280-token history, not two
SESSIONS = 4
FOLLOW_UP = " Go on, and say more about the last point."


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def histories(llm: LLM) -> list[list[int]]:
    body = llm.tokenizer.encode(" " + " ".join(PROMPTS) + "\n" + " ".join(reversed(PROMPTS)))
    return [llm.tokenizer.encode(f"Session {i} of {SESSIONS}:") + body for i in range(SESSIONS)]


def run_sessions(llm: LLM) -> list[list[CompletionOutput]]:
    """Each session's first turn, one after another, then each one's second (its first answer and a
    follow-up appended): by then the pool has evicted it for the others."""
    prompts = histories(llm)
    follow = llm.tokenizer.encode(FOLLOW_UP)
    first = [llm.generate([p], greedy(8))[0] for p in prompts]
    second = [llm.generate([p + o.token_ids + follow], greedy(8))[0] for p, o in zip(prompts, first)]
    return [first, second]


@pytest.fixture(scope="module")
def without_tier(model_dir) -> list[list[CompletionOutput]]:
    return run_sessions(LLM(str(model_dir), kv_disk_gb=0, **POOL))


@pytest.fixture
def kv_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMOPT_KV_DIR", str(tmp_path))
    return tmp_path


def tokens(runs: list[list[CompletionOutput]]) -> list[list[list[int]]]:
    return [[o.token_ids for o in turn] for turn in runs]


def test_resumed_sessions_load_from_disk_and_decode_the_same_tokens(
    model_dir, kv_dir, without_tier, hf_greedy
):
    llm = LLM(str(model_dir), kv_disk_gb=1, **POOL)
    runs = run_sessions(llm)
    assert tokens(runs) == tokens(without_tier)
    resumed = runs[1]
    assert all(o.disk_cached_tokens >= 200 for o in resumed), [o.disk_cached_tokens for o in resumed]
    assert all(o.disk_cached_tokens == 0 for turn in without_tier for o in turn)
    assert all(o.cached_tokens == 0 for o in without_tier[1])  # without the tier: all recomputed
    stats = llm.engine.stats()
    assert stats.prefix_cache_disk_hits == sum(o.disk_cached_tokens for o in resumed)
    assert stats.kv_disk.blocks_read > 0 and stats.kv_disk.blocks_missed == 0
    prompt = histories(llm)[0] + runs[0][0].token_ids + llm.tokenizer.encode(FOLLOW_UP)
    assert resumed[0].token_ids == hf_greedy(tuple(prompt), 8)


def test_a_corrupted_block_file_is_recomputed_never_served(model_dir, kv_dir, without_tier):
    llm = LLM(str(model_dir), kv_disk_gb=1, **POOL)
    engine = llm.engine
    prompts = histories(llm)
    first = [llm.generate([p], greedy(8))[0] for p in prompts]
    assert engine.disk_tier.store.flush(30)
    seq_digests = engine.block_manager.digests(
        Sequence("digests", prompts[0], greedy(1), seed=0), len(prompts[0]) // 16
    )
    victim = engine.disk_tier.store.folder / file_name(seq_digests[5])
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x40  # one bit of session 0's sixth block
    victim.write_bytes(bytes(data))
    follow = llm.tokenizer.encode(FOLLOW_UP)
    second = [llm.generate([p + o.token_ids + follow], greedy(8))[0] for p, o in zip(prompts, first)]
    assert tokens([first, second]) == tokens(without_tier)
    # The blocks before it only: it and those after it are computed.
    assert second[0].cached_tokens == second[0].disk_cached_tokens == 5 * 16
    assert all(o.disk_cached_tokens >= 200 for o in second[1:])
    # Deleted when it read as no block; the block computed instead was evicted and written again, whole.
    assert engine.stats().kv_disk.blocks_missed == 1 and engine.disk_tier.store.stats.bad_files == 1


def test_a_restarted_engine_finds_the_blocks_its_predecessor_left(model_dir, kv_dir, without_tier):
    before = LLM(str(model_dir), kv_disk_gb=1, **POOL)
    prompts = histories(before)
    first = [before.generate([p], greedy(8))[0] for p in prompts]
    before.close()  # what a stop (or the interpreter's exit) does: the pool's cached blocks go to disk too
    after = LLM(str(model_dir), kv_disk_gb=1, **POOL)
    follow = after.tokenizer.encode(FOLLOW_UP)
    second = [after.generate([p + o.token_ids + follow], greedy(8))[0] for p, o in zip(prompts, first)]
    assert tokens([first, second]) == tokens(without_tier)
    for prompt, out in zip(prompts, second):
        assert out.disk_cached_tokens >= len(prompt) // 16 * 16  # every session's blocks, from disk
