"""Generate gpqa_synthetic.csv: SYNTHETIC questions in the GPQA CSV format (not GPQA data).

The real GPQA-Diamond file cannot be fetched here (and is not ours to ship). This file has the same
columns, so the suite, the simulator and the smoke matrix exercise the real loading and scoring code.
Deterministic: `python suites/data/make_gpqa_synthetic.py` rewrites the same bytes.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

OUT = Path(__file__).with_name("gpqa_synthetic.csv")
COLUMNS = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
           "Incorrect Answer 3", "Subdomain"]


def product(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    return f"What is {a} multiplied by {b}?", a * b, "Arithmetic"


def wavelength(rng: random.Random) -> tuple[str, int, str]:
    speed, freq = rng.choice([340, 1500, 5000]), rng.randint(2, 40) * 10
    return (f"A wave travels at {speed} m/s with a frequency of {freq} Hz. "
            f"What is its wavelength, in millimetres (rounded down)?", speed * 1000 // freq, "Physics")


def moles(rng: random.Random) -> tuple[str, int, str]:
    grams = rng.randint(2, 50) * 18
    return (f"How many moles of water (molar mass 18 g/mol) are in {grams} g of water?\n"
            f"Give the whole number.", grams // 18, "Chemistry")


def codons(rng: random.Random) -> tuple[str, int, str]:
    aminos = rng.randint(20, 400)
    return (f"A protein has {aminos} amino acids. How many nucleotides, including one stop codon, "
            f"does its coding sequence have?", 3 * (aminos + 1), "Biology")


KINDS = (product, wavelength, moles, codons)


def distractors(rng: random.Random, correct: int) -> list[int]:
    wrong: set[int] = set()
    while len(wrong) < 3:
        candidate = correct + rng.choice([-1, 1]) * rng.randint(1, max(3, correct // 5))
        if candidate > 0 and candidate != correct:
            wrong.add(candidate)
    return sorted(wrong)


def main(count: int = 60, out: Path = OUT) -> None:
    """``count`` questions into ``out``. The draws are sequential, so a longer file (the 198-question one the gate
    power bench writes for a GPQA-Diamond-sized cell) starts with this file's rows."""
    rng = random.Random(2024)
    seen: set[str] = set()
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for index in range(count):
            question, answer, subdomain = KINDS[index % len(KINDS)](rng)
            while question in seen:  # question ids are hashes of the text: keep them unique
                question, answer, subdomain = KINDS[index % len(KINDS)](rng)
            seen.add(question)
            wrong = distractors(rng, answer)
            writer.writerow([f"synthetic-{index + 1:03d}", question, str(answer), *map(str, wrong), subdomain])


if __name__ == "__main__":
    main()
