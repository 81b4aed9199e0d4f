"""A calculator agent on the OpenAI Agents SDK (openai-agents), trained by keel unchanged.

The SDK agent is ordinary: a function tool, instructions, `Runner.run`. keel runs it once per
episode (`[env.agent] command = ["python3", "agents_sdk_calculator.py"]`) with OPENAI_BASE_URL,
OPENAI_API_KEY and KEEL_TASK set; the model is served by keel's gateway through the Chat
Completions API (the gateway does not serve the Responses API, so the agent names
`OpenAIChatCompletionsModel`, as it would for any Chat-Completions-compatible server). Tracing
is off: traces would go to OpenAI with the episode's key. Options: --log DIR writes the
conversation the SDK built to DIR/<api key>.json (keel's tests read it).
"""
import argparse
import asyncio
import json
import os

from agents import (Agent, MaxTurnsExceeded, OpenAIChatCompletionsModel, Runner,
                    function_tool, set_tracing_disabled)
from openai import AsyncOpenAI

from calculator_agent import calculate, post_reward


@function_tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression of numbers, + - * / and parentheses."""
    return calculate(expression)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log")
    args = parser.parse_args()
    set_tracing_disabled(True)
    task = json.loads(os.environ["KEEL_TASK"])
    system = "\n".join(m["content"] for m in task["prompt"] if m["role"] == "system")
    question = [m["content"] for m in task["prompt"] if m["role"] == "user"][-1]
    agent = Agent(
        name="calculator",
        instructions=system or "Answer with a number.",
        tools=[calculator],
        model=OpenAIChatCompletionsModel(model="policy",
                                         openai_client=AsyncOpenAI(max_retries=0)),
    )
    try:
        result = await Runner.run(agent, question, max_turns=4)
        answer = str(result.final_output or "").strip()
        items = result.to_input_list()
    except MaxTurnsExceeded:
        answer, items = "", []
    truths = task["ground_truth"] if isinstance(task["ground_truth"], list) else [task["ground_truth"]]
    reward = 1.0 if answer in [str(t) for t in truths] else 0.0
    post_reward(reward)
    if args.log:
        with open(os.path.join(args.log, os.environ["OPENAI_API_KEY"] + ".json"), "w") as f:
            json.dump({"answer": answer, "items": items, "reward": reward}, f, default=str)


if __name__ == "__main__":
    asyncio.run(main())
