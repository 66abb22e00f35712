"""Drives an mlx-iree server with the real `openai` client; prints one JSON object.

Usage: openai_check.py BASE_URL MODEL suite
       openai_check.py BASE_URL MODEL fanout PROMPT...   (all prompts at once, greedy)
       openai_check.py BASE_URL MODEL tools   (a greedy answer with tools offered, plain and streamed)
       openai_check.py BASE_URL MODEL structured   (chat.completions.parse with a pydantic model, 20 prompts)
       openai_check.py BASE_URL MODEL forced   (tool_choice required on 20 questions; a named function, streamed too)

Run by crates/mlx-iree/tests/openai.rs with the venv target/client-venv (pinned openai).
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
from typing import Literal

import pydantic

QUESTION = "What is the capital of France?"
PROMPT = "The capital of France is"


def suite(client, model):
    out = {}
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0
    )
    out["chat"] = {
        "text": chat.choices[0].message.content,
        "finish": chat.choices[0].finish_reason,
        "completion_tokens": chat.usage.completion_tokens,
    }
    pieces, finish = [], None
    for chunk in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0, stream=True
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    out["chat_stream"] = {"text": "".join(pieces), "finish": finish}
    done = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    out["completion"] = {"text": done.choices[0].text, "finish": done.choices[0].finish_reason}
    pieces = [c.choices[0].text for c in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True) if c.choices]
    out["completion_stream"] = {"text": "".join(pieces)}
    out["models"] = [m.id for m in client.models.list().data]
    out["logprobs"] = logprobs(client, model)
    out["n3"] = [[c.message.content for c in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a short poem about the sea."}], max_tokens=12,
        temperature=1.0, seed=11, n=3).choices] for _ in range(2)]
    errors = {}
    try:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=4)
    except openai.NotFoundError as e:
        errors["unknown_model"] = [e.status_code, e.body["message"] if isinstance(e.body, dict) else str(e.body)]
    try:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=100000)
    except openai.BadRequestError as e:
        errors["too_long"] = [e.status_code, e.body["message"] if isinstance(e.body, dict) else str(e.body)]
    # Fields the server does not implement, or values out of range: a 400 naming the field.
    refused = {
        "response_format": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
        "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        "frequency_penalty": {"frequency_penalty": 3},
        "foo": {"extra_body": {"foo": 1}},
    }
    for name, extra in refused.items():
        try:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=4, **extra)
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            errors[name] = [e.status_code, body.get("message"), body.get("param")]
    out["errors"] = errors
    return out


def logprobs(client, model):
    """Greedy chat logprobs, plain and streamed: [token, logprob, [[alternative, logprob]...]] each."""
    def entries(items):
        return [[t.token, t.logprob, [[a.token, a.logprob] for a in t.top_logprobs]] for t in items]

    kwargs = dict(model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=6, temperature=0,
                  logprobs=True, top_logprobs=3)
    plain = client.chat.completions.create(**kwargs)
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed += entries(chunk.choices[0].logprobs.content)
    return {
        "plain": entries(plain.choices[0].logprobs.content),
        "streamed": streamed,
        "completion_tokens": plain.usage.completion_tokens,
    }


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def answer(choice):
    """A non-streamed choice's tool calls (arguments parsed), their ids, finish reason and content."""
    return {
        "calls": [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                  for c in choice.message.tool_calls or []],
        "ids": [c.id for c in choice.message.tool_calls or []],
        "finish": choice.finish_reason,
        "content": choice.message.content,
    }


def streamed(client, kwargs):
    """The tool calls, finish reason and content accumulated from a streamed answer's deltas."""
    calls, content, finish = {}, None, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content = (content or "") + delta.content if delta.content else content
        for c in delta.tool_calls or []:
            entry = calls.setdefault(c.index, {"name": "", "arguments": ""})
            entry["name"] += c.function.name or ""
            entry["arguments"] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return {
        "calls": [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())],
        "finish": finish,
        "content": content,
    }


def tools(client, model):
    """The tool calls of a greedy answer (arguments parsed), plain and accumulated from streamed deltas."""
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
                  tool_choice="auto", temperature=0)
    return {"plain": answer(client.chat.completions.create(**kwargs).choices[0]), "streamed": streamed(client, kwargs)}


FORCED_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}},
        "required": ["zone"], "additionalProperties": False}}},
]

FORCED_QUESTIONS = [
    "Weather in Paris?", "What time is it in Tokyo?", "Will it rain in Oslo tomorrow?", "Time in Berlin?",
    "Is it sunny in Rome?", "Clock in London?", "Forecast for Lima this week?", "What hour is it now?",
    "Snow in Quebec?", "Temperature in Cairo?", "Current time in Osaka?", "Wind in Perth?", "Hi!",
    "Tell me a joke.", "Weather for 3 days in Nice?", "Time zone of Madrid?", "Humidity in Hanoi?",
    "What is 2+2?", "Storms in Miami?", "Sunrise in Reykjavik?",
]


def forced(client, model):
    """`tool_choice` "required" on 20 questions, and a named function plain and streamed: each answer."""
    def kwargs(question, choice):
        return dict(model=model, messages=[{"role": "user", "content": question}], tools=FORCED_TOOLS,
                    tool_choice=choice, temperature=0)

    named = kwargs("Weather in Paris?", {"type": "function", "function": {"name": "get_time"}})
    return {
        "required": [answer(client.chat.completions.create(**kwargs(q, "required")).choices[0])
                     for q in FORCED_QUESTIONS],
        "named": answer(client.chat.completions.create(**named).choices[0]),
        "named_streamed": streamed(client, named),
    }


class Place(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=12)
    coastal: bool


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    kind: Literal["capital", "town", "village"]
    place: Place
    sights: list[pydantic.constr(max_length=10)] = pydantic.Field(max_length=2)


CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Rome", "Dakar", "Perth", "Bergen", "Nice",
          "Porto", "Kyoto", "Cork", "Split", "Bruges", "Tangier", "Hobart", "Goa"]


def structured(client, model):
    """`parse` with a pydantic model on 20 prompts, and streamed on 3: each parsed object (or the refusal/error)."""
    def messages(city):
        return [{"role": "system", "content": "Reply in JSON."}, {"role": "user", "content": f"Describe {city}."}]

    out = {"parsed": [], "streamed": []}
    for city in CITIES:
        done = client.chat.completions.parse(model=model, messages=messages(city), response_format=City,
                                             temperature=0)
        parsed = done.choices[0].message.parsed
        out["parsed"].append(parsed.model_dump() if parsed else None)
    for city in CITIES[:3]:
        with client.chat.completions.stream(model=model, messages=messages(city), response_format=City,
                                            temperature=0) as stream:
            parsed = stream.get_final_completion().choices[0].message.parsed
        out["streamed"].append(parsed.model_dump() if parsed else None)
    return out


def fanout(client, model, prompts):
    def one(prompt):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
        return r.choices[0].text

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return {"texts": list(pool.map(one, prompts))}


def main():
    base_url, model, mode = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=300, max_retries=0)
    if mode == "suite":
        result = suite(client, model)
    elif mode == "tools":
        result = tools(client, model)
    elif mode == "forced":
        result = forced(client, model)
    elif mode == "structured":
        result = structured(client, model)
    else:
        result = fanout(client, model, sys.argv[4:])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
