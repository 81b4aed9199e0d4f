"""A tool-using agent written for the OpenAI API, trained by keel unchanged.

keel starts it once per episode (`[env.agent] command = ["python3", "calculator_agent.py"]`)
with OPENAI_BASE_URL (keel's gateway), OPENAI_API_KEY (the episode's key) and KEEL_TASK (the
dataset row as JSON: split, index, data_source, prompt, ground_truth, extra_info). Every call
it makes is one turn sampled by the policy being trained; its reward goes to
$OPENAI_BASE_URL/keel/reward before it exits. Run against any OpenAI-compatible server it is
an ordinary agent (with KEEL_TASK set by hand).

Options: --follow-up asks the model to check its answer once (a second user turn);
--compact rewrites the history after the first answer, as agents that compact their context
do: the model's draft is replaced by the calculation as one calculator call and its result,
and the model answers from there (keel trains the episode as two segments sharing its reward);
--logprobs asks for the sampled tokens' log-probs; --log DIR writes the final conversation
(with the conversations each segment started from, the log-probs, the task's split and when it
ran) to DIR/<api key>.json (used by keel's tests).
"""
import argparse
import ast
import json
import operator
import os
import re
import time
import urllib.request

from openai import OpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression of numbers, + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv, ast.USub: operator.neg}


def calculate(expression):
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("not arithmetic")
    try:
        value = ev(ast.parse(str(expression), mode="eval").body)
        return str(int(value) if float(value).is_integer() else value)
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
        return "error: not an arithmetic expression"


def run(client, messages, max_calls, logprobs=None):
    for _ in range(max_calls):
        extra = {"logprobs": True} if logprobs is not None else {}
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                               **extra)
        if logprobs is not None:
            content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else []
            logprobs.append([t.logprob for t in content or []])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculate(expression)})
    return ""


def compacted(task_messages, draft):
    """The task, then the calculation (from the draft's calculator call, else read off the
    question) as one calculator call and its result: the history a compacting agent keeps."""
    expression = ""
    for call in draft.get("tool_calls") or []:
        try:
            expression = json.loads(call["function"]["arguments"]).get("expression", "")
        except (json.JSONDecodeError, AttributeError, KeyError):
            pass
    if not expression:
        found = re.search(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+", task_messages[-1]["content"])
        expression = found.group(0) if found else ""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return task_messages + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": calculate(expression)},
    ]


def post_reward(reward):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/keel/reward",
        data=json.dumps({"reward": reward}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--follow-up", action="store_true")
    parser.add_argument("--compact", action="store_true")
    parser.add_argument("--max-calls", type=int, default=4)
    parser.add_argument("--log")
    parser.add_argument("--logprobs", action="store_true")
    args = parser.parse_args()
    logprobs = [] if args.logprobs else None
    started = time.time()
    task = json.loads(os.environ["KEEL_TASK"])
    client = OpenAI(max_retries=0)
    messages = [{"role": m["role"], "content": m["content"]} for m in task["prompt"]]
    segments = [list(messages)]
    answer = run(client, messages, args.max_calls, logprobs)
    if args.compact:
        messages = compacted(segments[0], messages[len(segments[0])])
        segments.append(list(messages))
        answer = run(client, messages, args.max_calls, logprobs)
    if args.follow_up:
        messages.append({"role": "user", "content": "Check it and give only the final number."})
        answer = run(client, messages, args.max_calls, logprobs)
    truths = task["ground_truth"] if isinstance(task["ground_truth"], list) else [task["ground_truth"]]
    reward = 1.0 if answer.strip() in [str(t) for t in truths] else 0.0
    post_reward(reward)
    if args.log:
        with open(os.path.join(args.log, os.environ["OPENAI_API_KEY"] + ".json"), "w") as f:
            json.dump({"messages": messages, "segments": segments, "tools": TOOLS, "reward": reward,
                       "logprobs": logprobs, "split": task["split"],
                       "ran": [started, time.time()]}, f)


if __name__ == "__main__":
    main()
