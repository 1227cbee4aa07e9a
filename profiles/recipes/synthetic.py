"""Synthetic chat tasks whose answers are exactly checkable (license: CC0-1.0, generated here).

Each task is a function `(rng: random.Random) -> {"prompt": str, "answer": str}` drawing one
example. They are deliberately short (prompt ≲ 30 tokens, answer ≲ 25) so that training and
eval sequences stay under ~80 tokens with the chat template.

Similar pairs on purpose (the pool's merge logic should find them close): `arith` and
`wordmath` (integer arithmetic, bare vs. in words), `jsonx` and `csvx` (the same sentences,
extracted into JSON vs. a CSV row).
"""

from __future__ import annotations

import json
import random
from decimal import Decimal

# --- arithmetic -------------------------------------------------------------------------------


def arith(rng: random.Random) -> dict[str, str]:
    """Exact integer arithmetic with + - * and the usual precedence: "Compute 37 + 8 * 6."."""
    shape = rng.choice(["a+b", "a-b", "a*b", "a+b*c", "a*b-c", "a-b+c"])
    # Two-digit operands and one-digit multipliers: with three-digit operands a 135M model
    # trained for 200 steps only guesses the magnitude (measured: 7% exact match).
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 99)
    if "*" in shape:
        b = rng.randint(2, 9)
    expr = shape.replace("a", str(a)).replace("b", str(b)).replace("c", str(c))
    expr = expr.replace("+", " + ").replace("-", " - ").replace("*", " * ")
    value = eval(expr, {"__builtins__": {}})  # noqa: S307 - expr is built above from ints only
    return {"prompt": f"Compute {expr}. Answer with the number only.", "answer": str(value)}


_NAMES = ["Ana", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas",
          "Kemal", "Lena", "Maya", "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq",
          "Uma", "Victor", "Wen", "Yara", "Zoe"]
_ITEMS = ["apples", "books", "marbles", "stickers", "coins", "pencils", "cards", "shells",
          "stamps", "cookies", "tickets", "bottles"]


def wordmath(rng: random.Random) -> dict[str, str]:
    """One- or two-step word problems with an integer answer (the wordy twin of `arith`)."""
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    kind = rng.choice(["gain_loss", "groups", "share", "buy"])
    if kind == "gain_loss":
        a, b = rng.randint(10, 200), rng.randint(2, 90)
        c = rng.randint(1, a + b - 1)
        text = (f"{name} has {a} {item}. {name} gets {b} more and gives {c} to {other}. "
                f"How many {item} does {name} have now?")
        value = a + b - c
    elif kind == "groups":
        a, b = rng.randint(2, 19), rng.randint(2, 30)
        text = f"{name} has {a} boxes with {b} {item} in each box. How many {item} is that in total?"
        value = a * b
    elif kind == "share":
        b, value = rng.randint(2, 12), rng.randint(2, 40)
        text = (f"{name} shares {b * value} {item} equally among {b} friends. "
                f"How many {item} does each friend get?")
    else:
        a, b = rng.randint(2, 15), rng.randint(2, 25)
        c = rng.randint(a * b, a * b + 300)
        text = (f"{name} has {c} dollars and buys {a} {item} at {b} dollars each. "
                f"How many dollars are left?")
        value = c - a * b
    return {"prompt": f"{text} Answer with the number only.", "answer": str(value)}


# --- unit conversion -------------------------------------------------------------------------

# Factor of each unit to its dimension's base unit, as exact decimals.
_UNITS = {
    "length": {"km": Decimal(1000), "m": Decimal(1), "cm": Decimal("0.01"), "mm": Decimal("0.001")},
    "mass": {"t": Decimal(1000), "kg": Decimal(1), "g": Decimal("0.001"), "mg": Decimal("0.000001")},
    "time": {"h": Decimal(3600), "min": Decimal(60), "s": Decimal(1)},
    "volume": {"L": Decimal(1), "dL": Decimal("0.1"), "mL": Decimal("0.001")},
    "data": {"GB": Decimal(10**9), "MB": Decimal(10**6), "kB": Decimal(10**3), "B": Decimal(1)},
}


def _plain(number: Decimal) -> str:
    """Decimal without exponent or trailing zeros: 3500, 0.25, 12."""
    text = format(number.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def units(rng: random.Random) -> dict[str, str]:
    """Exact SI-style unit conversion: "Convert 3.5 km to m." -> "3500 m"."""
    # A value with at most one decimal digit; redraw the pair and value while the result is
    # long (e.g. mg -> t gives 0.000000999), so every answer stays short and exact.
    while True:
        dimension = rng.choice(sorted(_UNITS))
        src, dst = rng.sample(sorted(_UNITS[dimension]), 2)
        value = Decimal(rng.randint(1, 999)) / (10 if rng.random() < 0.3 else 1)
        result = value * _UNITS[dimension][src] / _UNITS[dimension][dst]
        if len(_plain(result)) <= 8:
            break
    prompt = f"Convert {_plain(value)} {src} to {dst}. Answer with the value and unit only."
    return {"prompt": prompt, "answer": f"{_plain(result)} {dst}"}


# --- extraction ------------------------------------------------------------------------------

_SURNAMES = ["Lopez", "Novak", "Okafor", "Schmidt", "Tanaka", "Rossi", "Dubois", "Kowalski",
             "Haddad", "Silva", "Nguyen", "Larsen", "Moreau", "Ivanova", "Costa", "Fischer"]
_CITIES = ["Lyon", "Porto", "Osaka", "Lagos", "Quito", "Oslo", "Perth", "Krakow", "Cairo",
           "Denver", "Seville", "Tartu", "Hanoi", "Leeds", "Graz", "Recife"]
_PRODUCTS = ["desk lamp", "kettle", "backpack", "keyboard", "umbrella", "blender", "monitor",
             "water bottle", "notebook", "headphones", "toaster", "chair"]


def _record(rng: random.Random) -> tuple[list[str], list[object], str]:
    """A record (field names, values) and one sentence that states it, in a random phrasing."""
    if rng.random() < 0.5:
        name = f"{rng.choice(_NAMES)} {rng.choice(_SURNAMES)}"
        age, city = rng.randint(18, 90), rng.choice(_CITIES)
        sentence = rng.choice([
            f"{name} is {age} years old and lives in {city}.",
            f"Living in {city}, {name} turned {age} this year.",
            f"At {age}, {name} moved to {city}.",
        ])
        return ["name", "age", "city"], [name, age, city], sentence
    product, quantity = rng.choice(_PRODUCTS), rng.randint(1, 50)
    price = rng.randint(3, 400)
    sentence = rng.choice([
        f"The order contains {quantity} units of {product} at {price} dollars each.",
        f"We shipped {quantity} {product} units, priced at {price} dollars per unit.",
        f"A {product} costs {price} dollars; the customer bought {quantity}.",
    ])
    return ["product", "quantity", "price"], [product, quantity, price], sentence


def _field_order(rng: random.Random, fields: list[str], values: list[object]):
    order = rng.sample(range(len(fields)), len(fields))
    return [fields[i] for i in order], [values[i] for i in order]


def jsonx(rng: random.Random) -> dict[str, str]:
    """Extract a record from a sentence into a JSON object with the requested key order."""
    fields, values, sentence = _record(rng)
    fields, values = _field_order(rng, fields, values)
    answer = json.dumps(dict(zip(fields, values)))
    prompt = f"Extract {', '.join(fields)} as JSON: {sentence}"
    return {"prompt": prompt, "answer": answer}


def csvx(rng: random.Random) -> dict[str, str]:
    """Extract a record from a sentence into one CSV row (the CSV twin of `jsonx`)."""
    fields, values, sentence = _record(rng)
    fields, values = _field_order(rng, fields, values)
    prompt = f"Write the CSV row with columns {','.join(fields)} for: {sentence}"
    return {"prompt": prompt, "answer": ",".join(str(v) for v in values)}


# --- held-out families ---------------------------------------------------------------------------
# Tasks unlike the nine shipped profiles (no arithmetic, no units, no extraction into JSON/CSV,
# no prose), each a fixed rewriting of its input with one exact answer. `zenedge bench merge
# --profiles profiles/heldout` scores the pool on them: the merge gate and the compression
# thresholds were tuned on the shipped nine, never on these.

_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_WORDS = ["cat", "dog", "fish", "bird", "lamp", "tree", "river", "stone", "cloud", "bread", "chair",
          "glass", "horse", "apple", "train", "paper", "music", "ocean", "plant", "clock", "shirt",
          "table", "mouse", "honey", "candle", "garden", "pencil", "rocket", "violin", "window"]


def dates(rng: random.Random) -> dict[str, str]:
    """An ISO date in words, day first: "2024-03-15" -> "15 March 2024"."""
    year, month, day = rng.randint(1950, 2049), rng.randint(1, 12), rng.randint(1, 28)
    prompt = f"Write the date {year:04d}-{month:02d}-{day:02d} as day, month name and year."
    return {"prompt": prompt, "answer": f"{day} {_MONTHS[month - 1]} {year}"}


def phone(rng: random.Random) -> dict[str, str]:
    """Ten digits as a North American phone number: "5551234567" -> "(555) 123-4567"."""
    digits = "".join(str(rng.randint(0, 9)) for _ in range(10))
    return {"prompt": f"Format the phone number {digits}.",
            "answer": f"({digits[:3]}) {digits[3:6]}-{digits[6:]}"}


def digits(rng: random.Random) -> dict[str, str]:
    """A number read digit by digit: "4071" -> "four zero seven one"."""
    number = str(rng.randint(10, 999999))
    return {"prompt": f"Read the number {number} digit by digit.",
            "answer": " ".join(_DIGITS[int(d)] for d in number)}


def reverse(rng: random.Random) -> dict[str, str]:
    """A comma-separated list of three to five words in reverse order."""
    words = rng.sample(_WORDS, rng.randint(3, 5))
    return {"prompt": f"Reverse the order of this list: {', '.join(words)}",
            "answer": ", ".join(reversed(words))}


def initials(rng: random.Random) -> dict[str, str]:
    """A full name's initials, each followed by a period: "Ana Lopez" -> "A. L."."""
    parts = [rng.choice(_NAMES)] + ([rng.choice(_NAMES)] if rng.random() < 0.3 else []) + [rng.choice(_SURNAMES)]
    return {"prompt": f"Write the initials of {' '.join(parts)}.", "answer": " ".join(f"{p[0]}." for p in parts)}


def time24(rng: random.Random) -> dict[str, str]:
    """A 12-hour clock time in 24-hour form: "3:45 PM" -> "15:45"."""
    hour, minute, half = rng.randint(1, 12), rng.randint(0, 59), rng.choice(["AM", "PM"])
    value = hour % 12 + (12 if half == "PM" else 0)
    return {"prompt": f"Convert {hour}:{minute:02d} {half} to 24-hour time.", "answer": f"{value:02d}:{minute:02d}"}
