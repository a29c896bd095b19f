"""The built-in environments.

``calculator``  a tool-using math agent. A turn that holds ``<calc>EXPRESSION</calc>`` gets
                ``<result>VALUE</result>`` back (arithmetic only: + - * / // % ** and brackets, evaluated
                without ``eval``); a turn without a call is the final answer, which the recipe's reward
                functions score (``gsm8k``, ``math``). A call that cannot be evaluated answers its error and
                counts in env/tool_errors.
``guess``       a deterministic multi-turn task with feedback each turn: the model answers a number, the
                environment says ``higher`` or ``lower`` until it is the row's ground truth. A right answer at
                turn t scores ``1 - penalty * (t - 1)`` (at least 0): fewer turns, more reward.
"""

from __future__ import annotations

import ast
import operator
import re

import pydantic

from grpo_ray.envs.base import Environment, Step

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def arithmetic(text: str, limit: float = 1e15):
    """The value of an arithmetic expression: numbers, + - * / // % **, brackets; ValueError for anything else or a
    value past `limit` (so ``9**9**9`` is refused, not computed)."""

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            out = OPERATORS[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            out = OPERATORS[type(node.op)](value(node.operand))
        else:
            raise ValueError(f"not arithmetic: {ast.unparse(node)[:40]}")
        if abs(out) > limit:
            raise ValueError("value too large")
        return out

    try:
        tree = ast.parse(text.strip().replace("^", "**"), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {text.strip()[:40]!r}") from None
    return value(tree.body)


def show(x) -> str:
    """A result as the model reads it: integers without a decimal point, others to 6 significant digits."""
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


class Calculator(Environment):
    def reset(self, row: dict) -> None:
        pass

    def step(self, turn: str) -> Step:
        call = CALL.search(turn)
        if call is None:
            return Step(done=True)
        try:
            return Step(f"<result>{show(arithmetic(call.group(1)))}</result>", tool_call=True)
        except (ValueError, ZeroDivisionError, OverflowError) as e:
            return Step(f"<error>{e}</error>", tool_call=True, tool_error=True)


class Guess(Environment):
    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        penalty: float = pydantic.Field(0.25, ge=0, le=1)
        """Reward lost per turn before the right answer."""

    def reset(self, row: dict) -> None:
        self.target, self.turns = float(row["ground_truth"]), 0

    def step(self, turn: str) -> Step:
        self.turns += 1
        numbers = re.findall(r"-?\d+(?:\.\d+)?", turn)
        if not numbers:
            return Step("Answer with a number.")
        guess = float(numbers[-1])
        if guess == self.target:
            return Step(reward=max(0.0, 1.0 - self.options.penalty * (self.turns - 1)), done=True)
        return Step("higher" if guess < self.target else "lower")
