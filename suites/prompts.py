"""Fixed prompts for the accept and parity suites: varied, open-ended, asking for long answers
(so every request runs many speculative steps), and the same on every run; and the accept suite's categorised
workload built on them (``builtin_workload``)."""

from __future__ import annotations

from dataclasses import dataclass

PROMPTS: tuple[str, ...] = (
    "Explain how a hash map handles collisions, with a short example in Python.",
    "Write a detailed recipe for a vegetable curry, step by step.",
    "Describe the water cycle to a ten-year-old.",
    "Summarize the causes of the French Revolution in five paragraphs.",
    "Write a bash script that backs up a directory to a dated tarball and explain each line.",
    "What are the trade-offs between TCP and UDP? Give three use cases for each.",
    "Prove that the square root of 2 is irrational, explaining every step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain gradient descent and why the learning rate matters.",
    "List the planets of the solar system and describe one notable feature of each.",
    "Translate the following sentence into French, German and Spanish, then explain the grammar: "
    "'The cat that I saw yesterday was sleeping on the roof.'",
    "Compare merge sort and quicksort: complexity, stability, memory, and when to use which.",
    "Write a SQL query that finds the top three customers by total order value, and explain it.",
    "Explain how vaccines train the immune system.",
    "Describe how a bill becomes a law in a parliamentary democracy.",
    "Write a polite email asking a colleague to review a pull request by Friday.",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt of a workload, with the category its results are reported under and where it comes from."""

    text: str
    category: str
    source: str  # "builtin" | "mtbench" | a file path: CONTRACT.md, accept suite


# The categories: dspark_ci.ground.suites.ACCEPT_CATEGORIES (those that matter for speculation, then MT-Bench's own for
# everything else). MT-Bench's "coding" is "code".
CATEGORY_ALIASES = {"coding": "code"}
BUILTIN_CATEGORIES = ("code", "writing", "stem", "humanities", "code", "stem", "math", "writing", "stem", "stem",
                      "writing", "stem", "code", "stem", "humanities", "writing")
MATH_PROMPTS = (
    "Solve the equation 3x^2 - 12x + 9 = 0 step by step and check both roots.",
    "Calculate the compound interest on 2500 dollars at 4 percent a year over 6 years, showing every step.",
)
# Long context: a document of about LONG_CONTEXT_WORDS words (built here, deterministic) and a question about it.
LONG_CONTEXT_WORDS = 2400
LONG_CONTEXT_QUESTIONS = ("Summarize the report above in five bullet points.",
                          "List every decision the report above records, with its date.")


def long_context_document(words: int = LONG_CONTEXT_WORDS) -> str:
    """A long, repetitive but varied meeting report: the same every run (no randomness), ``words`` words long."""
    topics = ("budget", "hiring", "release", "security review", "migration", "on-call rota", "vendor contract")
    sentences, count, day = [], 0, 1
    while count < words:
        topic = topics[day % len(topics)]
        sentence = (f"On day {day} the team discussed the {topic}, agreed to revisit it after the next milestone, "
                    f"and recorded decision {day} in the shared log.")
        sentences.append(sentence)
        count += len(sentence.split())
        day += 1
    return " ".join(sentences)


def builtin_workload() -> tuple[Prompt, ...]:
    """The default accept workload: the fixed prompts (categories as MT-Bench would file them), two math prompts
    and two long-context ones, so code, math and long context each have prompts of their own."""
    document = long_context_document()
    return (tuple(Prompt(text, category, "builtin")
                  for text, category in zip(PROMPTS, BUILTIN_CATEGORIES, strict=False))
            + tuple(Prompt(text, "math", "builtin") for text in MATH_PROMPTS)
            + tuple(Prompt(f"{document}\n\n{question}", "long_context", "builtin")
                    for question in LONG_CONTEXT_QUESTIONS))


def category_of(name: str) -> str:
    return CATEGORY_ALIASES.get(name, name)
