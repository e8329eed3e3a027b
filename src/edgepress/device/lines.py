"""What a line of input is, for every reader of text files (a bundle's `predict.py --file` and `similar`'s corpus,
edgepress's .txt texts): `\n`, `\r\n` and `\r` end a line; every other character is text, U+2028, U+2029 and
U+0085 among them (`str.splitlines` would end lines there too, and a text holding one would become two)."""

import re

LINE_END = re.compile(r"\r\n|\r|\n")


def text_lines(text: str) -> list[str]:
    """The lines of `text`; a line end at its very end starts no line."""
    lines = LINE_END.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines
