"""The Responses API's store without a model: bounded by count and by bytes, the least recently used
evicted first, an entry readable and deletable only by its owner."""

from __future__ import annotations

from llmopt.server.response_store import ResponseStore, StoredResponse


def entry(owner: str = "me", text: str = "x") -> StoredResponse:
    return StoredResponse.of(owner, {"id": "r", "output": text}, [{"type": "message", "content": text}])


def test_the_oldest_goes_first_when_the_count_is_reached():
    store = ResponseStore(max_responses=2, max_bytes=10**6)
    for name in "abc":
        store.put(name, entry())
    assert store.get("a", "me") is None and store.get("b", "me") and store.get("c", "me")
    store.get("b", "me")  # a read makes it the most recent
    store.put("d", entry())
    assert store.get("c", "me") is None and store.get("b", "me") is not None
    assert len(store.entries) == 2


def test_the_byte_limit_evicts_as_many_as_it_takes_and_refuses_what_never_fits():
    size = entry().size
    store = ResponseStore(max_responses=100, max_bytes=3 * size)
    for name in "abc":
        store.put(name, entry())
    assert store.bytes == 3 * size
    big = entry(text="y" * (size // 2))  # about two entries
    assert store.put("big", big)
    assert store.get("a", "me") is None and store.get("b", "me") is None and store.bytes <= 3 * size
    assert not store.put("huge", entry(text="z" * 10 * size))  # over the limit alone: not stored
    assert store.get("huge", "me") is None and store.get("big", "me") is not None
    store.put("big", entry())  # replacing an entry counts its bytes once
    assert store.bytes == sum(e.size for e in store.entries.values())


def test_another_owner_can_neither_read_nor_delete_an_entry():
    store = ResponseStore()
    store.put("r1", entry(owner="alice"))
    assert store.get("r1", "mallory") is None
    assert not store.delete("r1", "mallory")
    assert store.get("r1", "alice") is not None
    assert store.delete("r1", "alice") and store.get("r1", "alice") is None and store.bytes == 0
