"""A synthetic, offline, reproducible byte corpus for the course's tiny trained model.

Quality effects of KV compression mean nothing on random weights, so the repo trains its own
small model. It needs text with two properties:

* local structure a small model can learn quickly (templated prose about caches and a made-up town),
  so its held-out loss can sit clearly below a byte-unigram baseline;
* long-range structure that only a full cache can serve: **records** written early in a
  ``ledger:`` line and **recalled** anywhere up to 500 bytes later, e.g. ``ledger: x4821 q0937``
  ... ``recall x4821.`` (key ``x``, value ``4821``: the value follows the key directly, so "find
  the earlier ``x`` and copy what came next" answers it, the copying small models learn first,
  "induction heads"). Keys are letters that nothing else in a document uses, so there is exactly
  one place to look.

Three kinds of document: ``document`` (the corpus proper: ledger, prose, recalls, echoes),
``repeat_document`` (a random string repeated: copying, densely) and ``lookup_document`` (a short
ledger drill); training starts on the last two (see ``kvref.train``).

Every document is a pure function of ``(seed, index)``, so training and held-out data never need
to be stored: ``document(seed, i, length)``. Held-out documents use a different seed from training.
"""

from __future__ import annotations

import random
import re
import string

import torch

TRAIN_SEED = 1234
PHASE1_SEED = 1  # the first training phase's documents
HELDOUT_SEED = 98765

# -- prose the repo writes itself ------------------------------------------------------------------
_SUBJECTS = [
    "the cache", "the model", "a reader", "the old door", "each layer", "the decoder", "a number", "the ledger",
    "the scribe", "the potter", "a red hen", "the pond", "my neighbour", "the teacher", "a small robot",
    "the long prompt", "one head", "the window", "the scheduler", "the town",
]
_VERBS = [
    "holds", "reads", "writes", "forgets", "remembers", "shifts", "counts", "stores", "finds", "copies",
    "watches", "drops", "follows", "answers", "measures", "sorts", "carries", "opens",
]
_OBJECTS = [
    "the latest word", "each number", "a list of numbers", "the first word", "old memories", "the bread",
    "a long road", "the last page", "each record", "the morning train", "a blue door", "the whole prompt",
    "two apples", "the attention scores", "a paper map", "the strong heads", "one more byte", "the pond edge",
]
_TAILS = [
    "before the night", "with great care", "again and again", "in the cold morning", "without a sound",
    "for the following step", "when the bell rings", "as a good friend", "at the end of the day",
    "one byte at a time", "near the old bridge", "so nothing is lost",
]
_CONNECT = ["and then", "but later", "so", "while", "because"]


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(_TAILS)}"
    if rng.random() < 0.3:
        s += f", {rng.choice(_CONNECT)} {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    return s[0].upper() + s[1:] + ". "


def prose(rng: random.Random, n_bytes: int) -> str:
    """At least ``n_bytes`` bytes of templated sentences."""
    out = ""
    while len(out) < n_bytes:
        out += _sentence(rng)
    return out


# -- records: key=value, recalled far later --------------------------------------------------------
_KEY = "jkqvxz"  # letters neither the prose nor the echoes use, so a key is found only where it was written


def random_key(rng: random.Random, taken: str = "") -> str:
    """One letter of ``jkqvxz`` not in ``taken``, e.g. ``x`` (a document holds at most 6 keys)."""
    return rng.choice([c for c in _KEY if c not in taken])


def random_value(rng: random.Random) -> str:
    """Four digits, e.g. ``4821``."""
    return "".join(rng.choice(string.digits) for _ in range(4))


def _records(rng: random.Random, n: int, taken: str = "") -> dict[str, str]:
    """``n`` records (at most 6) with distinct keys, none of them in ``taken``."""
    recs: dict[str, str] = {}
    while len(recs) < n:
        recs[random_key(rng, taken + "".join(recs))] = random_value(rng)
    return recs


_ECHO = "".join(c for c in string.ascii_lowercase + string.digits if c not in _KEY)
_REPEAT = string.ascii_lowercase + string.digits  # repeat documents hold no records, so every letter may occur


def _ledger(recs: dict[str, str]) -> str:
    return "ledger: " + " ".join(f"{k}{v}" for k, v in recs.items()) + "\n"


def document(seed: int, index: int, length: int) -> bytes:
    """Training-style document of exactly ``length`` bytes.

    A ledger of 1-6 records, then prose with ``recall KEYVALUE.`` lines and some ``echo abc12 abc12.``
    repeats. Each record is recalled exactly once, at a random point of the document, so the distance
    from a record to its recall runs from a few bytes to the whole document, and the only place to
    find the value is the ledger (were a key recalled twice, the second recall could copy the first,
    and a model would never learn to look further).
    """
    rng = random.Random(seed * 1_000_003 + index)
    recs = _records(rng, rng.randint(1, 6))
    text = _ledger(recs)
    due = sorted((rng.randint(len(text), length - 12), k) for k in recs)  # (byte offset, key): when to recall
    while len(text) < length:
        if due and len(text) >= due[0][0]:
            k = due.pop(0)[1]
            text += f"recall {k}{recs[k]}. "
        elif rng.random() < 0.15:  # verbatim repetition of random bytes: the plainest copying signal there is
            s = "".join(rng.choice(_ECHO) for _ in range(rng.randint(5, 20)))
            text += f"echo {s} {s}. "
        else:
            text += prose(rng, rng.randint(20, 100))
    return text.encode()[:length]


def repeat_document(seed: int, index: int, length: int) -> bytes:
    """One random string of 8-64 letters and digits, repeated (space-separated) to ``length`` bytes:
    after the first copy, every byte can be predicted by finding the previous copy and reading what
    followed it.

    That move ("induction heads") is what a recall needs, and small models find it only after a
    plateau; these documents, dense in it, get the model over the plateau early in training."""
    rng = random.Random(seed * 1_000_003 + index + 999)
    s = "".join(rng.choice(_REPEAT) for _ in range(rng.randint(8, 64)))
    return ((s + " ") * (length // (len(s) + 1) + 1)).encode()[:length]


def lookup_document(seed: int, index: int, length: int) -> bytes:
    """A short drill: a ledger of 2-6 records, then each recalled once, in random order, between bits
    of prose. Every recall must look the key up in the ledger (first training phase, ~128 bytes)."""
    rng = random.Random(seed * 1_000_003 + index + 4242)
    recs = _records(rng, rng.randint(2, 6))
    text = _ledger(recs)
    order = list(recs)
    rng.shuffle(order)
    while len(text) < length:
        if order and rng.random() < 0.5:
            k = order.pop()
            text += f"recall {k}{recs[k]}. "
        else:
            text += prose(rng, rng.randint(5, 40))
    return text.encode()[:length]


def copy_targets(doc: bytes) -> list[int]:
    """Positions t of a repeat document whose next byte t + 1 is a copy (the second copy on)."""
    period = doc.index(b" ") + 1
    return list(range(period - 1, len(doc) - 1))


def answer_positions(doc: bytes) -> list[int]:
    """Positions t whose next byte t + 1 is a digit of a recalled value (``recall x4821``: the 4 digits)."""
    out = []
    for m in re.finditer(rb"recall [a-z](\d{1,4})", doc):
        out += [m.start(1) + j - 1 for j in range(len(m.group(1)))]
    return out


def recall_prompt(seed: int, index: int, length: int, n_records: int = 4) -> tuple[bytes, bytes, int]:
    """A held-out retrieval probe of at most ``length`` bytes: (prompt, answer, distance).

    The ledger comes first, then prose only, then ``recall KEY``: the answer (4 digits) must be
    copied from the ledger, ``distance`` bytes back (several hundred for length 512).
    """
    rng = random.Random(seed * 7_000_003 + index)
    recs = _records(rng, n_records)
    head = _ledger(recs)
    key = rng.choice(list(recs))
    query = f"recall {key}"
    room = length - len(head) - len(query) - 4  # leave room for the 4 answer digits
    body = ""
    while True:  # whole sentences only
        nxt = _sentence(rng)
        if len(body) + len(nxt) > room:
            break
        body += nxt
    prompt = (head + body + query).encode()
    answer = recs[key].encode()
    distance = len(prompt) - (head.index(key) + len(key))
    return prompt, answer, distance


def batch(seed: int, start: int, n: int, length: int) -> torch.Tensor:
    """Documents ``start .. start + n - 1`` as a (n, length) LongTensor of byte ids."""
    return torch.tensor([list(document(seed, start + i, length)) for i in range(n)], dtype=torch.long)


def unigram_nll(seed: int = TRAIN_SEED, n_docs: int = 512, length: int = 512,
                heldout: torch.Tensor | None = None) -> float:
    """Cross-entropy (nats/byte) of a byte-unigram model fitted on training docs, scored on ``heldout``."""
    counts = torch.ones(256)  # add-one smoothing
    counts += torch.bincount(batch(seed, 0, n_docs, length).flatten(), minlength=256).float()
    logp = (counts / counts.sum()).log()
    if heldout is None:
        heldout = batch(HELDOUT_SEED, 0, 64, length)
    return float(-logp[heldout.flatten()].mean())
