"""Write examples/data/quickstart_chat.jsonl: a small, learnable chat dataset in the `messages` format.

Each conversation asks for arithmetic, unit conversions or string facts and answers in a fixed
phrasing, so a tiny model's loss visibly falls within a few dozen steps. Run:
    python examples/make_quickstart_data.py
"""

import json
import random
from pathlib import Path

rng = random.Random(1234)
OUT = Path(__file__).parent / "data" / "quickstart_chat.jsonl"


def turn() -> tuple[str, str]:
    kind = rng.choice(["add", "mul", "km", "upper", "len"])
    if kind == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
    if kind == "km":
        k = rng.randint(1, 50)
        return f"How many metres are in {k} kilometres?", f"{k} kilometres are {k * 1000} metres."
    word = rng.choice(["ray", "torch", "shard", "packing", "cluster", "gradient", "token", "kernel"])
    if kind == "upper":
        return f"Write '{word}' in capital letters.", f"{word.upper()}"
    return f"How many letters does '{word}' have?", f"'{word}' has {len(word)} letters."


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as f:
        for i in range(240):
            msgs = []
            if i % 5 == 0:
                msgs.append({"role": "system", "content": "You are a precise assistant. Answer in one sentence."})
            for _ in range(rng.choice([1, 1, 2, 3])):
                q, a = turn()
                msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": msgs}) + "\n")


if __name__ == "__main__":
    main()
