"""The simulated engine's answers to sparkctl's quality task (`sparkctl_arith`, kept in sparkctl's
bench package, which the sim does not import): a prompt that asks "Compute <expression>." gets
the expression's value on a last line `Answer: N`, right for a share of the questions equal to
the engine's accuracy (its profile's, or the `accuracy` fault), and otherwise a plausible near
miss. Which questions come out right is drawn from a hash of the expression, so a run's accuracy
is the same on every run, and a lower accuracy gets a subset of the same questions right (a drop
against an earlier run is a drop). The expression is parsed, never evaluated as code: only
integers, + - * and parentheses. Pure; `server.py` asks it for each completion.
"""

from __future__ import annotations

import ast
import hashlib

_ASKED = "Compute "
_LONGEST = 200  # characters of an expression the sim works out; the task's are under 40
_OPERATORS = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}


def answer(prompt: str, accuracy: float) -> str | None:
    """The reply to the last question of the task in `prompt`, or None when it asks none."""
    expression = _expression(prompt)
    value = _value(expression) if expression is not None else None
    if value is None:
        return None
    draw = _draw(expression, "right")
    if draw >= accuracy:
        value += _miss(expression)
    return f"Answer: {value}"  # no working shown: each token takes the profile's decode time


def _expression(prompt: str) -> str | None:
    start = prompt.rfind(_ASKED)
    if start < 0:
        return None
    end = prompt.find(".", start)
    text = prompt[start + len(_ASKED):end if end >= 0 else None].strip()
    return text if 0 < len(text) <= _LONGEST else None


def _value(expression: str) -> int | None:
    try:
        tree = ast.parse(expression, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    return _walk(tree)


def _walk(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _walk(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _walk(node.left), _walk(node.right)
        return None if left is None or right is None else _OPERATORS[type(node.op)](left, right)
    return None


def _draw(expression: str, purpose: str) -> float:
    """A number in [0, 1) fixed by the expression: the same question, the same draw."""
    digest = hashlib.sha256(f"{purpose}:{expression}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _miss(expression: str) -> int:
    """A wrong answer's distance from the right one: 1 to 10, either way (a slip, not noise)."""
    step = 1 + int(_draw(expression, "miss") * 10)
    return step if _draw(expression, "sign") < 0.5 else -step
