"""A calculator that is safe against any input a model can write.

It parses with `ast` and walks an allowlist: numbers, + - * / // % ** (`^` is power too),
unary signs, parentheses, a few math functions and the constants pi and e. Nothing is ever
passed to `eval`. Every operation whose result could be huge (powers, products, factorials,
rounding to negative digits) is sized BEFORE it is computed, so every input answers in well
under 100 ms; Python's own errors come back as plain sentences.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import unicodedata
from collections.abc import Callable

from sandcell.tools.registry import Spec, Tool, ToolError

MAX_INPUT_CHARS = 1000
MAX_DEPTH = (
    200  # nesting of the expression tree (a sum of n terms is n deep); _eval recurses per level
)
MAX_DIGITS = 4000  # an int result larger than this is refused (it stays printable: < 4300)
MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))  # every 4,000-digit number fits
MAX_ROUND_DIGITS = 1000  # round(x, -n) builds 10**n: bound n


class CalcError(ValueError):
    """A refusal or a math error, worded for the person (or model) who typed the expression."""


Number = int | float

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "·": "*", "∗": "*", "−": "-", "–": "-", "π": "pi"})
_THOUSANDS = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.])")


def normalise(expr: str) -> str:
    """Full-width and typographic forms to ASCII Python: `１２×３＾２` -> `12*3**2`."""
    # Superscript powers first: NFKC would turn `3²` into `32`.
    expr = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹]+", lambda m: "**" + m.group().translate(_SUPERSCRIPTS), expr)
    expr = unicodedata.normalize("NFKC", expr).translate(_SYMBOLS)
    expr = expr.replace("^", "**").strip()
    expr = expr.removesuffix("=").strip()  # "2+2=" is a common way to ask
    return _drop_thousands_separators(expr)


def _drop_thousands_separators(expr: str) -> str:
    """`1,234.5` is one number, except inside a call, where commas separate arguments:
    `max(1,234)` keeps its two arguments."""
    in_call = [False] * len(expr)
    stack: list[bool] = []
    for i, ch in enumerate(expr):
        if ch == "(":
            before = expr[:i].rstrip()
            stack.append(bool(before) and (before[-1].isalnum() or before[-1] == "_"))
        elif ch == ")" and stack:
            stack.pop()
        in_call[i] = bool(stack) and stack[-1]
    parts, last = [], 0
    for m in _THOUSANDS.finditer(expr):
        if not in_call[m.start()]:
            parts += [expr[last : m.start()], m.group().replace(",", "")]
            last = m.end()
    return "".join(parts) + expr[last:]


def _bits(x: Number) -> int:
    return abs(x).bit_length() if isinstance(x, int) else 0


def _too_big(what: str, bits: float) -> CalcError:
    digits = int(bits / math.log2(10)) + 1
    return CalcError(
        f"{what} would have about {digits:,} digits; the calculator stops at {MAX_DIGITS:,} digits. "
        "Use logarithms (e.g. log10) to estimate its size, or the python tool for exact big numbers."
    )


def _check_int(x: Number, what: str = "the result") -> Number:
    if isinstance(x, int) and x.bit_length() > MAX_BITS:
        raise _too_big(what, x.bit_length())
    if isinstance(x, float) and not math.isfinite(x):
        raise CalcError(f"{what} is too large for a floating-point number (over about 1.8e308)")
    if isinstance(x, complex):
        raise CalcError(
            "the result is a complex number; the calculator works with real numbers only"
        )
    return x


def _pow(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        bits = b * math.log2(abs(a))  # the result's size in bits, computed without the result
        if bits > MAX_BITS:
            raise _too_big(
                f"{a if _bits(a) < 64 else 'this number'}**{b if _bits(b) < 64 else '...'}", bits
            )
    if isinstance(a, (int, float)) and a < 0 and isinstance(b, float) and not b.is_integer():
        raise CalcError("a negative number to a fractional power is not a real number")
    return a**b


def _mul(a: Number, b: Number) -> Number:
    if _bits(a) + _bits(b) > MAX_BITS + 1:
        raise _too_big("this product", _bits(a) + _bits(b))
    return a * b


BINOPS: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}
_REFUSED_OPS = {
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "xor",
    ast.MatMult: "@",
}


def _integral(x: Number, fn: str) -> int:
    if isinstance(x, float):
        if not x.is_integer():
            raise CalcError(f"{fn}() needs a whole number, got {x!r}")
        return int(x)
    return x


def _factorial(n: Number) -> int:
    n = _integral(n, "factorial")
    if n < 0:
        raise CalcError("factorial() is not defined for negative numbers")
    if n > 2:
        bits = math.lgamma(n + 1) / math.log(2)  # log2(n!) without computing n!
        if bits > MAX_BITS:
            raise _too_big(f"factorial({n})" if n < 10**12 else "this factorial", bits)
    return math.factorial(n)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    ndigits = _integral(ndigits, "round")
    if abs(ndigits) > MAX_ROUND_DIGITS:
        raise CalcError(f"round() takes at most {MAX_ROUND_DIGITS} digits, got {ndigits}")
    return round(x, ndigits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


def _minmax(fn: Callable) -> Callable[..., Number]:
    def f(*args: Number) -> Number:
        if not args:
            raise CalcError(f"{fn.__name__}() needs at least one number")
        return fn(args)

    return f


FUNCTIONS: dict[
    str, tuple[Callable[..., Number], int, int]
] = {  # name: (function, min args, max args)
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (_minmax(min), 1, 100),
    "max": (_minmax(max), 1, 100),
    "sqrt": (math.sqrt, 1, 1),
    "log": (_log, 1, 2),
    "log10": (math.log10, 1, 1),
    "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "factorial": (_factorial, 1, 1),
}

_ALLOWED = "numbers, + - * / // % ** (or ^), parentheses, pi, e and " + ", ".join(FUNCTIONS)


def _depth(tree: ast.AST) -> int:
    deepest, todo = 0, [(tree, 1)]
    while todo:  # iterative: a recursive walk could itself overflow the stack
        node, d = todo.pop()
        deepest = max(deepest, d)
        todo.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float, complex)):
            kind = "text" if isinstance(node.value, str) else type(node.value).__name__
            raise CalcError(f"{kind} is not allowed; write a number (allowed: {_ALLOWED})")
        if isinstance(node.value, complex):
            raise CalcError(
                "imaginary numbers are not supported; the calculator works with real numbers"
            )
        return _check_int(node.value, "a number in the expression")
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op not in BINOPS:
            hint = "; for powers of two write 2**n" if op in (ast.LShift, ast.RShift) else ""
            raise CalcError(
                f"the operator {_REFUSED_OPS.get(op, op.__name__)} is not supported{hint}"
            )
        left, right = _eval(node.left), _eval(node.right)
        return _check_int(BINOPS[op](left, right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise CalcError(f"{node.id} is a function: call it like {node.id}(2)")
        raise CalcError(f"unknown name `{node.id}`; allowed: {_ALLOWED}")
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Tuple):
        raise CalcError(
            "commas separate function arguments; write thousands as 1234 or 1,234 "
            "and evaluate one expression at a time"
        )
    raise CalcError(
        f"{_describe(node)} is not allowed in a calculator expression; allowed: {_ALLOWED}"
    )


def _call(node: ast.Call) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)[:40]
        raise CalcError(f"unknown function `{name}`; allowed functions: {', '.join(FUNCTIONS)}")
    name = node.func.id
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise CalcError(f"{name}() takes plain positional numbers, e.g. round(2.345, 2)")
    fn, lo, hi = FUNCTIONS[name]
    if not lo <= len(node.args) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        hint = (
            "; inside a call write big numbers without commas (1234567)"
            if len(node.args) > hi
            else ""
        )
        raise CalcError(f"{name}() takes {want} argument(s), got {len(node.args)}{hint}")
    args = [_eval(a) for a in node.args]
    return _check_int(fn(*args))


def _describe(node: ast.AST) -> str:
    names = {
        ast.Attribute: "attribute access",
        ast.Subscript: "indexing",
        ast.Compare: "a comparison",
        ast.BoolOp: "and/or",
        ast.Lambda: "lambda",
        ast.IfExp: "if/else",
        ast.List: "a list",
        ast.Dict: "a dict",
        ast.Set: "a set",
        ast.JoinedStr: "an f-string",
        ast.NamedExpr: "assignment (:=)",
    }
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return "a comprehension"
    if isinstance(node, ast.UnaryOp):
        return "`not`" if isinstance(node.op, ast.Not) else "bitwise ~"
    return names.get(type(node), type(node).__name__)


def evaluate(expr: str) -> int | float:
    """Evaluate one arithmetic expression; raise CalcError with a plain message otherwise."""
    if not isinstance(expr, str):
        raise CalcError(f"the expression must be text, got {type(expr).__name__}")
    if len(expr) > MAX_INPUT_CHARS:
        raise CalcError(
            f"the expression is {len(expr):,} characters; the limit is {MAX_INPUT_CHARS:,}. "
            "Split it into parts, or use the python tool."
        )
    text = normalise(expr)
    if not text:
        raise CalcError("the expression is empty; write something like 2*(3+4)")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise CalcError(f"could not read `{text[:80]}`: {exc.msg}{where}") from None
    except (RecursionError, MemoryError):
        raise CalcError(f"the expression is nested too deeply (limit {MAX_DEPTH} levels)") from None
    if _depth(tree) > MAX_DEPTH:
        raise CalcError(
            f"the expression is nested too deeply (limit {MAX_DEPTH} levels); split it up"
        )
    try:
        return _eval(tree.body)
    except CalcError:
        raise
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except OverflowError as exc:
        if "convert to float" in str(exc):  # a big exact int met a float or a float function
            raise CalcError(
                "a whole number over about 1.8e308 cannot be mixed with decimals or with "
                "sqrt/log/sin..., which work in floating point"
            ) from None
        raise CalcError(
            "the result is too large for a floating-point number (over about 1.8e308)"
        ) from None
    except ValueError as exc:
        msg = (
            "math domain error: the input is outside the function's domain (e.g. sqrt(-1), log(0))"
        )
        raise CalcError(msg if "domain" in str(exc) else str(exc)) from None
    except TypeError as exc:
        raise CalcError(str(exc)) from None
    except (RecursionError, MemoryError):
        raise CalcError("the expression is too complex to evaluate; split it up") from None


def format_number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value)) + ".0"
    return repr(value)


def _calculate(expression: str) -> str:
    try:
        return format_number(evaluate(expression))
    except CalcError as exc:
        raise ToolError(f"calculator: {exc}") from None


SPEC = Spec(
    name="calculator",
    description=(
        "Exact arithmetic on one expression, e.g. '(1,234.5 * 3) ^ 2 / 7' or 'sqrt(2) * pi'. "
        "Not for data in files, dates or statistics: use python."
    ),
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)

calculator_tool = Tool.of(SPEC, _calculate, timeout_s=5.0, cacheable=True)
