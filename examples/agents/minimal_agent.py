import json, os, urllib.request
from openai import OpenAI

task = json.loads(os.environ["KEEL_TASK"])                      # the dataset row
reply = OpenAI().chat.completions.create(model="policy", messages=task["prompt"])
answer = (reply.choices[0].message.content or "").strip()
reward = float(answer == str(task["ground_truth"]))
urllib.request.urlopen(urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/keel/reward", data=json.dumps({"reward": reward}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})).read()
