"""Durable runs through DBOS (`pip install 'agentkv[dbos]'`), for many workers on one database.

`ak.DBOSAgent(agent)` makes the agent's runs DBOS workflows, as pydantic-ai's DBOS integration does:
each model reply is a DBOS step, and so is each tool call, checkpointed in DBOS's system database
(Postgres, or SQLite for one machine). After a crash, `DBOS.launch()` in the next process recovers
the run: completed steps return their recorded results (no reply generated twice, no finished call
run twice) and the run goes on live, its next prompt read back from the engine's disk tier (each
live step pins its prompt first, which writes it through). DBOS steps run at least once: a tool call
that was running at the crash runs again, so give such tools idempotent effects, or use `ak.Journal`,
which asks instead.

Build the DBOSAgent before `DBOS.launch()` (DBOS registers workflows by name at definition).
"""

from __future__ import annotations

from typing import Any

from agentkv.errors import RequestError


class DBOSSteps:
    """What a run makes through DBOS: a model reply and a tool call, each a step."""

    def __init__(self, model_step, tool_step):
        self._model, self._tool = model_step, tool_step

    async def model(self, index: int, make) -> dict:
        return await self._model(index, make)

    async def tool(self, name: str, run) -> dict:
        return await self._tool(name, run)


class DBOSAgent:
    """An agent whose runs are DBOS workflows named after it (`name`, default the agent's name)."""

    def __init__(self, agent, *, name: str | None = None):
        try:
            from dbos import DBOS  # here: an extra, loaded only by those who use it
        except ImportError as e:
            raise RequestError(f"DBOSAgent needs DBOS ({e}); install it with pip install 'agentkv[dbos]'") from None
        self.agent, self.name = agent, name or agent.name

        @DBOS.step(name=f"agentkv.{self.name}.model")
        async def model_step(index: int, make) -> dict:
            return await make()

        @DBOS.step(name=f"agentkv.{self.name}.tool")
        async def tool_step(call: str, run) -> dict:
            return await run()

        steps = DBOSSteps(model_step, tool_step)

        @DBOS.workflow(name=f"agentkv.{self.name}.run")
        async def run_workflow(input: Any, history: Any):
            return await agent._run(input, history=history, steps_via=steps)

        self._workflow = run_workflow

    async def run(self, input: Any, *, run_id: str, history: Any = None):
        """Run the agent as the DBOS workflow `run_id` (a run of that id already finished returns its
        result); returns the AgentResult."""
        from dbos import SetWorkflowID

        with SetWorkflowID(run_id):
            return await self._workflow(input, history)

    async def resume(self, run_id: str):
        """The AgentResult of the run `run_id`, which DBOS recovers at launch after a crash (waits for it)."""
        from dbos import DBOS

        handle = await DBOS.retrieve_workflow_async(run_id)
        return await handle.get_result()
