"""The graded set that ships (``scenarios/graded.jsonl``): checkable items made from a seed, nothing
downloaded.

Arithmetic, counting, copying a list, a small JSON object and multiple choice, in English and
Chinese, from easy (one digit sums, four-option questions a child answers) to hard for a 135M model
(three-digit products, letters counted in a word, JSON with three keys): a small model gets some
right and some wrong serially, which is what a graded comparison under load needs. Each item carries
its ``expected`` answer and ``grade``.

    python -m kevload.inputs.gradedset > scenarios/graded.jsonl      (make graded-set)

The same seed gives the same bytes on any machine: Python's ``random.Random(seed)`` is stable across
versions for ``randrange``/``choice``/``sample`` on ints and sequences.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import orjson

SEED = 29
PER_KIND = 5  # items of each kind in each language

_WORDS_EN = (
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "sun",
    "tree",
    "book",
    "milk",
    "rain",
    "star",
    "fish",
)
_WORDS_ZH = ("红", "蓝", "绿", "猫", "狗", "太阳", "树", "书", "牛奶", "雨", "星星", "鱼")
_FRUITS_EN = ("apple", "pear", "plum", "grape", "lemon", "mango", "peach", "cherry")
_FRUITS_ZH = ("苹果", "梨", "李子", "葡萄", "柠檬", "芒果", "桃子", "樱桃")
_NAMES = ("Ada", "Lin", "Omar", "Mei", "Sara", "Ken")
# (question, right option, wrong options) in each language.
_CHOICES_EN = (
    ("Which one is a fruit?", "banana", ("car", "stone", "chair")),
    ("Which animal can fly?", "bird", ("cow", "fish", "horse")),
    ("Which number is the largest?", "97", ("12", "45", "9")),
    ("What colour is the sky on a clear day?", "blue", ("green", "red", "black")),
    ("How many days are in a week?", "7", ("5", "10", "3")),
    ("Which is the opposite of hot?", "cold", ("warm", "fast", "tall")),
)
_CHOICES_ZH = (
    ("下面哪一个是水果？", "香蕉", ("汽车", "石头", "椅子")),
    ("哪种动物会飞？", "鸟", ("牛", "鱼", "马")),
    ("哪个数最大？", "97", ("12", "45", "9")),
    ("晴天时天空是什么颜色？", "蓝色", ("绿色", "红色", "黑色")),
    ("一个星期有几天？", "7", ("5", "10", "3")),
    ("“热”的反义词是什么？", "冷", ("暖", "快", "高")),
)
LETTERS = "ABCD"


def _arithmetic(rng: random.Random, i: int, zh: bool) -> dict[str, Any]:
    # Harder with i: one digit sums, two digit sums, two digit differences, a two by one digit
    # product, three digits.
    kind = i % 5
    a, b = [
        (rng.randrange(1, 10), rng.randrange(1, 10)),
        (rng.randrange(10, 100), rng.randrange(10, 100)),
        (rng.randrange(50, 100), rng.randrange(10, 50)),
        (rng.randrange(11, 100), rng.randrange(3, 10)),
        (rng.randrange(100, 1000), rng.randrange(100, 1000)),
    ][kind]
    op, value = ("-", a - b) if kind == 2 else ("×", a * b) if kind == 3 else ("+", a + b)
    prompt = (
        f"{a} {op} {b} 等于多少？只回答数字。"
        if zh
        else f"What is {a} {op} {b}? Answer with the number only."
    )
    return {"prompt": prompt, "expected": value, "grade": "number"}


def _counting(rng: random.Random, i: int, zh: bool) -> dict[str, Any]:
    if i % 2:  # letters in a word: hard for a small model
        word = rng.choice(("strawberry", "banana", "bookkeeper", "mississippi", "committee"))
        letter = rng.choice(sorted(set(word)))
        prompt = (
            f"单词“{word}”里有几个字母“{letter}”？只回答数字。"
            if zh
            else f"How many times does the letter '{letter}' appear in '{word}'? "
            "Answer with the number only."
        )
        return {"prompt": prompt, "expected": word.count(letter), "grade": "number"}
    words = rng.sample(_WORDS_ZH if zh else _WORDS_EN, rng.randrange(2, 7))
    listed = "、".join(words) if zh else ", ".join(words)
    prompt = (
        f"这个列表里有几个词：{listed}？只回答数字。"
        if zh
        else f"How many words are in this list: {listed}? Answer with the number only."
    )
    return {"prompt": prompt, "expected": len(words), "grade": "number"}


def _copying(rng: random.Random, i: int, zh: bool) -> dict[str, Any]:
    words = rng.sample(_FRUITS_ZH if zh else _FRUITS_EN, 3 + i % 4)
    listed = "，".join(words) if zh else ", ".join(words)
    prompt = (
        f"请原样重复这个列表，不要加别的话：{listed}"
        if zh
        else f"Repeat this list exactly, and nothing else: {listed}"
    )
    return {"prompt": prompt, "expected": listed, "grade": "contains"}


def _json_object(rng: random.Random, i: int, zh: bool) -> dict[str, Any]:
    name, age = rng.choice(_NAMES), rng.randrange(20, 70)
    obj: dict[str, Any] = {"name": name, "age": age}
    if i % 2:
        obj["city"] = rng.choice(("Paris", "Lima", "Oslo"))
    keys = ", ".join(f'"{k}" = {orjson.dumps(v).decode()}' for k, v in obj.items())
    prompt = (
        f"写一个 JSON 对象，包含这些键和值：{keys}。只回答 JSON。"
        if zh
        else f"Write a JSON object with these keys and values: {keys}. Answer with the JSON only."
    )
    return {"prompt": prompt, "expected": obj, "grade": "json"}


def _choice(rng: random.Random, i: int, zh: bool) -> dict[str, Any]:
    question, right, wrong = (_CHOICES_ZH if zh else _CHOICES_EN)[i % len(_CHOICES_EN)]
    options = [right, *wrong]
    rng.shuffle(options)
    listed = " ".join(
        f"{letter}. {option}" for letter, option in zip(LETTERS, options, strict=True)
    )
    prompt = (
        f"{question} {listed} 只回答选项字母。"
        if zh
        else f"{question} {listed} Answer with the letter only."
    )
    return {"prompt": prompt, "expected": LETTERS[options.index(right)], "grade": "choice"}


KINDS: dict[str, Callable[[random.Random, int, bool], dict[str, Any]]] = {
    "sum": _arithmetic,
    "count": _counting,
    "copy": _copying,
    "json": _json_object,
    "choice": _choice,
}


def items(seed: int = SEED, per_kind: int = PER_KIND) -> Iterator[dict[str, Any]]:
    """Every item, in a fixed order: each kind, English then Chinese, ``per_kind`` of each."""
    rng = random.Random(seed)
    for kind, make in KINDS.items():
        for lang in ("en", "zh"):
            for i in range(per_kind):
                yield {"id": f"{kind}-{lang}-{i}", **make(rng, i, lang == "zh"), "max_tokens": 48}


def jsonl(seed: int = SEED, per_kind: int = PER_KIND) -> bytes:
    return b"".join(orjson.dumps(item) + b"\n" for item in items(seed, per_kind))


if __name__ == "__main__":
    sys.stdout.buffer.write(jsonl())
