"""Drives troupe-mcp with the official MCP Python SDK, for the bridge's tests.

Reads a plan as JSON on stdin and writes what happened as JSON on stdout:

    {"connections": [
        {"transport": "stdio", "command": "...", "args": [], "env": {...},
         "list_tools": true, "calls": [{"name": "...", "arguments": {...}}]},
        {"transport": "http", "url": "http://127.0.0.1:PORT/mcp",
         "headers": {"Authorization": "Bearer ..."}, "calls": [...]}
    ]}

gives

    {"connections": [{"server_info": {...}, "tools": [...], "results": [...]}, ...]}

where tools and results are the wire form (camelCase) of what the server sent.
A connection that fails records {"error": "..."} and the run goes on. The
Rust test makes every assertion.
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

TIMEOUT_S = 60


def wire(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def run_session(read, write, plan):
    out = {}
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        out["server_info"] = wire(init.server_info)
        if plan.get("list_tools"):
            listed = await session.list_tools()
            out["tools"] = [wire(tool) for tool in listed.tools]
        results = []
        for call in plan.get("calls", []):
            try:
                result = await session.call_tool(call["name"], call.get("arguments", {}))
                results.append(wire(result))
            except Exception as e:  # a protocol error: keep it for the test to see
                results.append({"protocolError": f"{type(e).__name__}: {e}"})
        out["results"] = results
    return out


async def run_connection(plan):
    if plan["transport"] == "stdio":
        params = StdioServerParameters(
            command=plan["command"], args=plan.get("args", []), env=plan.get("env", {})
        )
        async with stdio_client(params) as (read, write):
            return await run_session(read, write, plan)
    async with httpx2.AsyncClient(headers=plan.get("headers", {}), timeout=TIMEOUT_S) as client:
        async with streamable_http_client(plan["url"], http_client=client) as (read, write):
            return await run_session(read, write, plan)


async def main():
    plan = json.load(sys.stdin)
    outputs = []
    for connection in plan["connections"]:
        try:
            outputs.append(await asyncio.wait_for(run_connection(connection), TIMEOUT_S))
        except Exception as e:  # reported for the test to check, not hidden
            outputs.append({"error": f"{type(e).__name__}: {e!r}"})
    json.dump({"connections": outputs}, sys.stdout)


asyncio.run(main())
