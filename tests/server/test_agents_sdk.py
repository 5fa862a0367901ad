"""The OpenAI Agents SDK on its default model path (OpenAIResponsesModel: the Responses API, streamed
and not) against the live server, with a function tool: the agent calls the tool, gets its result back
and answers."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI

from tests.conftest import API_KEY

MODEL = "smollm2-135m"


def run_agent(server, streamed: bool) -> tuple[list[str], object]:
    agents = pytest.importorskip("agents")
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    async def main():
        agents.set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        # The default model path: a model name, the default client, the Responses API.
        agents.set_default_openai_client(client, use_for_tracing=False)
        agent = agents.Agent(
            name="weather",
            instructions="Answer in one sentence.",
            model=MODEL,
            tools=[get_weather],
            # "required" so that a 135M model calls the tool; the SDK resets it after the call.
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=40, temperature=0),
        )
        if not streamed:
            return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        result = agents.Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    return calls, asyncio.run(main())


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_an_agent_calls_its_function_tool_and_answers(server, streamed):
    calls, result = run_agent(server, streamed)
    assert len(calls) == 1 and calls[0]
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert isinstance(result.final_output, str) and result.final_output
    # Each model call went through /v1/responses and reported usage.
    assert len(result.raw_responses) == 2 and all(r.usage.input_tokens > 0 for r in result.raw_responses)
