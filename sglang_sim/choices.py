"""Running the samples of one HTTP request (``n`` choices, or a batch of prompts) side by side."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dspark_ci.sglang_sim.engine import Engine, Generation, Job


class Choices:
    """Start every sample at once; ``steps()`` yields ``(index, tokens)`` in the order steps finish."""

    def __init__(self, engine: Engine, jobs: list[Job]):
        self.engine, self.jobs = engine, jobs
        self.generations: list[Generation] = [engine.start(job) for job in jobs]

    async def steps(self) -> AsyncIterator[tuple[int, list[str]]]:
        if len(self.jobs) == 1:  # the common case needs no task or queue
            async with contextlib.aclosing(self.engine.run(self.generations[0], self.jobs[0])) as steps:
                async for tokens in steps:
                    yield 0, tokens
            return
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(index, queue)) for index in range(len(self.jobs))]
        try:
            remaining = len(tasks)
            while remaining:
                index, tokens = await queue.get()
                if tokens is None:
                    remaining -= 1
                else:
                    yield index, tokens
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump(self, index: int, queue: asyncio.Queue) -> None:
        try:
            async for tokens in self.engine.run(self.generations[index], self.jobs[index]):
                queue.put_nowait((index, tokens))
        finally:
            queue.put_nowait((index, None))

    def stepping(self):
        """``steps()`` as a context manager that always finishes the samples (releases their rank)."""
        return contextlib.aclosing(self.steps())

    async def run_to_end(self) -> list[Generation]:
        async with self.stepping() as steps:
            async for _ in steps:
                pass
        return self.generations
