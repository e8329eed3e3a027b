"""Texts a compressed model is held to its teacher on, beyond the test split: the test split with typos (seeded), and,
for the demo data, the other registers of its archive (tweets, Amazon reviews, NYT editorials), labelled as the
movie snippets are. A student that learned the train set's points and not the teacher's function parts from the
teacher on these first."""

import random

import numpy as np

TYPO_SEED = 0
REGISTERS = {"tweets": "tweets", "amazon": "Amazon product review snippets",
             "nyt": "New York Times editorial snippets"}


def typo(text: str, rng: random.Random) -> str:
    """A typo in about one word in six (at least one): a letter dropped, doubled, or swapped with the next; words
    shorter than three letters are left as they are."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, len(words) // 6)) if words else []:
        w = words[i]
        if len(w) < 3:
            continue
        j = rng.randrange(len(w) - 1)
        edit = rng.choice(("drop", "double", "swap"))
        words[i] = (w[:j] + w[j + 1:] if edit == "drop" else w[:j] + w[j] + w[j:] if edit == "double"
                    else w[:j] + w[j + 1] + w[j] + w[j + 2:])
    return " ".join(words)


def with_typos(texts: tuple[str, ...], seed: int = TYPO_SEED) -> tuple[str, ...]:
    """`texts` with typos, one seeded generator drawn through them in order: the same texts give the same copies."""
    rng = random.Random(seed)
    return tuple(typo(text, rng) for text in texts)


def demo_registers(size: int | None = None) -> dict[str, dict]:
    """{register: {"texts", "labels", "how"}}: the first `size` non-empty sentences (file order; None: all of them) of
    each other register in the demo data's archive, labelled as the demo is (mean human rating > 0 = positive)."""
    from edgepress.data.movie import load_register

    sets = {}
    for register, how in REGISTERS.items():
        rows = [r for r in load_register(register) if r[1]][:size]
        sets[register] = {"texts": tuple(r[1] for r in rows), "labels": np.array([r[2] for r in rows]),
                          "how": f"{how} (Hutto & Gilbert 2014, mean human rating > 0 = positive)"}
    return sets
