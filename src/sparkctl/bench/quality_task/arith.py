"""sparkctl's own quality task, `sparkctl_arith`: multi-step integer arithmetic with exact answers.

Each item is an expression of four numbers and three operations (+, -, *), some grouped by
parentheses, asked as "Compute <expression>." with the answer wanted on a last line
`Answer: <integer>`; lm-eval scores the last such line by exact match (`sparkctl_arith.yaml`).
A model that answers fluently and wrongly after a new image, patch set, quantization or draft
gets these wrong; random weights get none right. The items are generated from a fixed seed and
kept in `arith.jsonl` (regenerate with `python -m sparkctl.bench.quality_task.arith`; a unit
test checks the file is what this generates), so every run of the gate asks the same questions
and a drop against a stack's last passing run means the stack changed, not the test. lm-eval
loads them through `load` (its `custom_dataset`): no network, no dataset cache.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

DATA = Path(__file__).with_name("arith.jsonl")
SEED = 49
ITEMS = 200
# The shapes of the four operands a, b, c, d: where the parentheses group them.
SHAPES = ("({a} {x} {b}) {y} {c} {z} {d}", "{a} {x} ({b} {y} {c}) {z} {d}", "({a} {x} {b}) {y} ({c} {z} {d})",
          "{a} {x} {b} {y} ({c} {z} {d})", "(({a} {x} {b}) {y} {c}) {z} {d}")
QUESTION = "Compute {expression}. End your reply with a last line 'Answer: N', where N is the integer result."


def generate(n: int = ITEMS, seed: int = SEED) -> list[dict]:
    """`n` items {"id", "question", "answer"}: the answer is the expression's exact value, as text."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        shape = SHAPES[rng.randrange(len(SHAPES))]
        x, y, z = (rng.choice("+-*") for _ in range(3))
        a, b, c, d = (rng.randint(2, 40) for _ in range(4))
        expression = shape.format(a=a, b=b, c=c, d=d, x=x, y=y, z=z)
        items.append({"id": i, "question": QUESTION.format(expression=expression),
                      "answer": str(_value(expression))})
    return items


def load(**_: object) -> dict:
    """lm-eval's `custom_dataset`: the shipped items as the `test` split."""
    import datasets  # lm-eval's own dependency, there whenever lm-eval calls this

    lines = DATA.read_text().splitlines()
    return {"test": datasets.Dataset.from_list([json.loads(line) for line in lines if line])}


def _value(expression: str) -> int:
    # Python's own grammar for + - * and parentheses on integers: the exact value.
    return int(eval(expression, {"__builtins__": {}}))  # noqa: S307 - only digits, operators, parentheses


def main() -> None:
    DATA.write_text("".join(json.dumps(item) + "\n" for item in generate()))
    print(f"wrote {ITEMS} items to {DATA}", file=sys.stderr)


if __name__ == "__main__":
    main()
