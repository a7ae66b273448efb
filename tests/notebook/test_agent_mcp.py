"""An agent's view of a failed cell, through the real Jupyter MCP server (``jupyter-mcp-server``
over stdio, the ``mcp`` SDK's client) against a real Jupyter server on 127.0.0.1: it learns the
state and the command from the first 400 characters, restarts with blocking through the server's
own execute tool, and gets its values back in the next kernel through the tools alone."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "jupyter_mcp_server",
    reason="the `agents` extra (.ci/run installs it in an environment of its own, .venv-agents)",
)

from jupyter_harness import JupyterServer
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from pytorch_texts import ASSERT_2_9

# 64 threads print the same failed assert, as a GPU does for one bad batch.
DEVICE = (
    "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
    "block: [0,0,0], thread: [{i},0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
)
FAIL = (
    f"os.write(2, {''.join(DEVICE.format(i=i) for i in range(64)).encode()!r})\n"
    f"raise torch.AcceleratorError({ASSERT_2_9!r})"
)
VERDICT = re.compile(
    r"^nb_cudaguard: CUDA context (?P<state>POISONED), restart (?P<restart>required); "
    r"cause=(?P<cause>[a-z-]+); run: (?P<command>%cudaguard restart)$",
    re.MULTILINE,
)


@pytest.fixture
def collaborative_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[JupyterServer]:
    """The MCP server edits notebooks through the collaboration API (jupyter_server_ydoc)."""
    # ipykernel forwards fd 2 to the cell except under pytest (it checks this variable)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    server = JupyterServer(
        tmp_path,
        extra_args=(
            "--ServerApp.jpserver_extensions=jupyter_server_fileid=True",
            "--ServerApp.jpserver_extensions=jupyter_server_ydoc=True",
            f"--BaseFileIdManager.db_path={tmp_path / 'fileid.db'}",
            f"--SQLiteYStore.db_path={tmp_path / 'ystore.db'}",
        ),
    )
    try:
        notebook = {
            "cells": [],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (server.root / "agent.ipynb").write_text(json.dumps(notebook))
        yield server
    finally:
        server.stop()


class Agent:
    """What an agent does: call the MCP server's tools and read the text they return."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def run(self, source: str) -> str:
        result = await self.session.call_tool(
            "insert_execute_code_cell", {"cell_index": -1, "cell_source": source, "timeout": 60}
        )
        return "\n".join(getattr(part, "text", "") for part in result.content)


async def _drive(server: JupyterServer) -> dict[str, str]:
    executable = shutil.which("jupyter-mcp-server", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {**server.env, "JUPYTER_URL": server.url, "JUPYTER_TOKEN": server.token}
    env.update(DOCUMENT_ID="agent.ipynb", JUPYTER_MCP_EXECUTION_TIMEOUT="60")
    params = StdioServerParameters(
        command=executable, args=["start", "--transport", "stdio"], env=env, cwd=str(server.root)
    )
    seen: dict[str, str] = {}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        agent = Agent(session)
        await agent.run(
            "%load_ext nb_cudaguard\nimport os, torch\n"
            "answer = 42\nlabels = torch.tensor([1, 2, 3])"
        )
        pid = await agent.run("print(os.getpid())")
        seen["failed"] = await agent.run(FAIL)
        found = VERDICT.search(seen["failed"][:400])
        assert found is not None, seen["failed"][:1000]
        seen["restart"] = await agent.run(found["command"])
        old = re.findall(r"^(\d+)$", pid, re.M)[-1]
        for _ in range(60):  # the kernel is back within seconds, nb_cudaguard loaded by the
            await asyncio.sleep(1)  # restart: its first cell shows what was kept, and how
            now = await agent.run("import os\nprint(os.getpid())")
            pids = re.findall(r"^(\d+)$", now, re.M)
            if pids and pids[-1] != old:
                break
        seen["load"] = now
        command = re.search(r"%cudaguard restore\b", seen["load"])
        assert command is not None, seen["load"]
        seen["restore"] = await agent.run(command.group(0))
        seen["values"] = await agent.run(
            "print(answer, labels.tolist(), os.environ.get('CUDA_LAUNCH_BLOCKING'))"
        )
    return seen


def test_an_agent_reads_the_verdict_restarts_and_restores_through_the_mcp_server(
    collaborative_server: JupyterServer,
) -> None:
    seen = asyncio.run(asyncio.wait_for(_drive(collaborative_server), 300))
    print(json.dumps(seen, indent=1)[:6000])
    first = seen["failed"][:400]
    found = VERDICT.search(first)
    assert found is not None and found["cause"] == "label-out-of-range"
    # one copy of the GPU's line reaches the cell; the other 63 are counted
    stream = seen["failed"].split("\n\n```text\n")[0]  # up to the panel's markdown
    assert stream.count("Assertion `t >= 0 && t < n_classes` failed.") == 1
    assert "63 more lines of the same assert" in seen["failed"]
    # the restart names what it kept and what the next kernel's first cell does with it
    assert "Kept" in seen["restart"] and "first cell offers to restore" in seen["restart"]
    assert "CUDA_LAUNCH_BLOCKING=1" in seen["load"]
    assert "Restored" in seen["restore"]
    assert "42 [1, 2, 3] 1" in seen["values"]
