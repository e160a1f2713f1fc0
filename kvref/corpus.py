"""A synthetic, offline, reproducible byte corpus for the course's tiny trained model.

Quality effects of KV compression mean nothing on random weights, so the repo trains its own
small model. It needs text with two properties:

* local structure a small model can learn quickly (templated prose about caches and a made-up town),
  so its held-out loss can sit clearly below a byte-unigram baseline;
* long-range structure that only a full cache can serve: **records** ``key=value.`` written early
  and **recalled** hundreds of bytes later, e.g. ``XK7=4821.`` ... ``recall XK7=4821.``

Every document is a pure function of ``(seed, index)``, so training and held-out data never need
to be stored: ``document(seed, i, length)``. Held-out documents use a different seed from training.
"""

from __future__ import annotations

import random
import string

import torch

TRAIN_SEED = 1234
HELDOUT_SEED = 98765

# -- prose the repo writes itself ------------------------------------------------------------------
_SUBJECTS = [
    "the cache", "the model", "a query", "the old key", "each layer", "the decoder", "a value", "the ledger",
    "the clerk", "the baker", "a red fox", "the river", "my neighbour", "the teacher", "a small robot",
    "the long prompt", "every head", "the window", "the scheduler", "the town",
]
_VERBS = [
    "keeps", "reads", "writes", "forgets", "remembers", "moves", "counts", "stores", "finds", "copies",
    "watches", "drops", "follows", "answers", "measures", "sorts", "carries", "opens",
]
_OBJECTS = [
    "the newest token", "every value", "a list of numbers", "the first word", "old memories", "the bread",
    "a quiet street", "the last page", "each record", "the morning train", "a blue door", "the whole prompt",
    "two apples", "the attention scores", "a paper map", "the heavy hitters", "one more byte", "the river bank",
]
_TAILS = [
    "before the night", "with great care", "again and again", "in the cold morning", "without a sound",
    "for the next step", "when the bell rings", "like a patient friend", "at the end of the day",
    "one token at a time", "near the old bridge", "so nothing is lost",
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
def random_key(rng: random.Random) -> str:
    """Three bytes: two capitals and a digit, e.g. ``XK7`` (6760 possible keys)."""
    return rng.choice(string.ascii_uppercase) + rng.choice(string.ascii_uppercase) + rng.choice(string.digits)


def random_value(rng: random.Random) -> str:
    """Four digits, e.g. ``4821``."""
    return "".join(rng.choice(string.digits) for _ in range(4))


def _records(rng: random.Random, n: int) -> dict[str, str]:
    recs: dict[str, str] = {}
    while len(recs) < n:
        recs[random_key(rng)] = random_value(rng)
    return recs


_ECHO = string.ascii_lowercase + string.digits


def document(seed: int, index: int, length: int, warmup: bool = False) -> bytes:
    """Training-style document of exactly ``length`` bytes.

    A ledger of records, then prose interleaved with ``recall KEY=VALUE.`` lines that repeat
    earlier records (near and far), ``echo abc12 abc12.`` repeats, sometimes a new ledger.
    ``warmup=True``: the mix of the first training phase, heavy on echoes and small ledgers, where
    copying is easiest to discover (small models learn "find the earlier match, copy what came
    next" only after a plateau; plentiful easy examples shorten it).
    """
    rng = random.Random(seed * 1_000_003 + index + (7_777_777 if warmup else 0))
    # Ledgers of every size: with one record, recall is "copy what followed the earlier '='" (plain
    # induction); more records make the model match the whole key.
    sizes = [1, 1, 2, 2, 3, 4] if warmup else [1, 2, 3, 4, 5, 6, 8, 10]
    mix = (0.15, 0.5, 0.9) if warmup else (0.35, 0.75, 0.9)  # cumulative: prose, recall, echo, new ledger
    recs = _records(rng, rng.choice(sizes))
    text = "ledger: " + " ".join(f"{k}={v}." for k, v in recs.items()) + "\n"
    while len(text) < length:
        r = rng.random()
        if r < mix[0]:
            text += prose(rng, rng.randint(20, 100))
        elif r < mix[1]:
            k = rng.choice(list(recs))
            text += f"recall {k}={recs[k]}. "
        elif r < mix[2]:  # verbatim repetition of random bytes: the plainest copying signal there is
            s = "".join(rng.choice(_ECHO) for _ in range(rng.randint(5, 20)))
            text += f"echo {s} {s}. "
        else:
            new = _records(rng, rng.randint(1, 3))
            recs.update(new)
            text += "ledger: " + " ".join(f"{k}={v}." for k, v in new.items()) + "\n"
    return text.encode()[:length]


def recall_prompt(seed: int, index: int, length: int, n_records: int = 8) -> tuple[bytes, bytes, int]:
    """A held-out retrieval probe of at most ``length`` bytes: (prompt, answer, distance).

    The ledger comes first, then prose only, then ``recall KEY=``: the answer (4 digits) must be
    copied from the ledger, ``distance`` bytes back (several hundred for length 512).
    """
    rng = random.Random(seed * 7_000_003 + index)
    recs = _records(rng, n_records)
    head = "ledger: " + " ".join(f"{k}={v}." for k, v in recs.items()) + "\n"
    key = rng.choice(list(recs))
    query = f"recall {key}="
    room = length - len(head) - len(query) - 4  # leave room for the 4 answer digits
    body = ""
    while True:  # whole sentences only
        nxt = _sentence(rng)
        if len(body) + len(nxt) > room:
            break
        body += nxt
    prompt = (head + body + query).encode()
    answer = recs[key].encode()
    distance = len(prompt) - (head.index(f"{key}=") + len(key) + 1)
    return prompt, answer, distance


def batch(seed: int, start: int, n: int, length: int, warmup: bool = False) -> torch.Tensor:
    """Documents ``start .. start + n - 1`` as a (n, length) LongTensor of byte ids."""
    return torch.tensor([list(document(seed, start + i, length, warmup)) for i in range(n)], dtype=torch.long)


def unigram_nll(seed: int = TRAIN_SEED, n_docs: int = 512, length: int = 512,
                heldout: torch.Tensor | None = None) -> float:
    """Cross-entropy (nats/byte) of a byte-unigram model fitted on training docs, scored on ``heldout``."""
    counts = torch.ones(256)  # add-one smoothing
    counts += torch.bincount(batch(seed, 0, n_docs, length).flatten(), minlength=256).float()
    logp = (counts / counts.sum()).log()
    if heldout is None:
        heldout = batch(HELDOUT_SEED, 0, 64, length)
    return float(-logp[heldout.flatten()].mean())
