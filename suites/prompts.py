"""Fixed prompts for the accept and parity suites: varied, open-ended, asking for long answers
(so every request runs many speculative steps), and the same on every run."""

from __future__ import annotations

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
