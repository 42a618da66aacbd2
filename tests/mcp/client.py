"""A real MCP client (the official Python SDK) driving `agent-bash mcp` over stdio.

Usage: client.py SCENARIO BIN STATE_DIR [ARGS...]. Each scenario asserts what a client sees and
prints `ok <scenario>` at the end (plus JSON facts the Rust test checks); a failed assertion
exits non-zero. tests/suite/mcp.rs runs these; scripts/mcp-client.sh installs the SDK.
"""

import json
import os
import subprocess
import sys
import time

import anyio
import jsonschema
import mcp_types as types
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def server(bin_path, state, extra_env=None, nvim="off", config_extra=""):
    env = {
        "XDG_STATE_HOME": os.environ.get("MCP_TEST_XDG_STATE") or os.path.join(state, "xdg"),
        "AGENT_BASH_LOG": os.path.join(state, "log"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", state),
    }
    env.update(extra_env or {})
    config = os.path.join(state, "config.toml")
    with open(config, "w") as f:
        f.write(f'state_dir = "{state}"\n[interceptor]\nenabled = true\n{config_extra}')
    return StdioServerParameters(
        command=bin_path, args=["mcp", "--config", config, "--nvim", nvim], env=env, cwd=state
    )


def emit(**facts):
    print(json.dumps(facts), flush=True)


def text_of(result):
    assert len(result.content) == 1, result
    return result.content[0].text


def data(result, structured=False):
    """The BashResult (or bash_undo's data) of a tool result: in `_meta` under
    `agent-bash/result`; structured content only when the server was asked for it."""
    assert result.meta is not None and "agent-bash/result" in result.meta, result
    got = result.meta["agent-bash/result"]
    if structured:
        assert result.structured_content == got, result
    else:
        assert result.structured_content is None, result
    return got


async def basics(bin_path, state):
    params = server(bin_path, state)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, client_info=types.Implementation(name="test-agent", version="1")) as s:
            init = await s.initialize()
            assert init.server_info.name == "agent-bash", init
            assert init.capabilities.tools is not None and init.capabilities.resources is not None

            tools = (await s.list_tools()).tools
            assert [t.name for t in tools] == ["bash", "bash_undo"], tools
            bash = tools[0]
            jsonschema.Draft202012Validator.check_schema(bash.input_schema)
            # Text only by default: no output schema, so no structured content an agent could
            # show its model instead of the text (contract §11).
            assert bash.output_schema is None, bash
            assert tools[1].output_schema is None, tools[1]
            assert bash.input_schema["required"] == ["command"]
            for k in ["command", "timeout", "cwd", "head", "tail", "session_key"]:
                assert bash.input_schema["properties"][k]["description"], k

            # State is kept between calls (one persistent shell).
            r1 = await s.call_tool("bash", {"command": "export GREETING=hello; cd /; greet() { echo \"$GREETING $1\"; }"})
            assert not r1.is_error, r1
            r2 = await s.call_tool("bash", {"command": "greet world"})
            assert text_of(r2) == "hello world\n", r2
            assert data(r2)["output"] == "hello world\n"
            assert data(r2)["exit_code"] == 0 and r2.is_error is False

            # A non-zero exit is an error result with the exact §7 wording.
            r3 = await s.call_tool("bash", {"command": "echo out; exit 3"})
            assert r3.is_error and text_of(r3) == "out\n\nCommand exited with code 3", r3
            assert data(r3)["exit_code"] == 3

            # Bad input and blocked commands: tool errors with the exact §3 / §2 texts.
            r4 = await s.call_tool("bash", {"command": "pwd", "cwd": "/no/such/dir"})
            assert r4.is_error and text_of(r4) == "Working directory does not exist: /no/such/dir", r4
            r5 = await s.call_tool("bash", {"command": "pwd", "timeout": -1})
            assert r5.is_error and text_of(r5).startswith("Invalid timeout: -1"), r5
            r6 = await s.call_tool("bash", {"command": "cat notes.txt", "tools": ["read"]})
            assert r6.is_error, r6
            assert text_of(r6) == (
                "Blocked: Use the `read` tool instead of cat/head/tail. It provides better context "
                "and handles binary files.\n\nOriginal command: cat notes.txt"
            ), r6
            assert data(r6)["blocked"]["suggested_tool"] == "read"
            r7 = await s.call_tool("bash", {})
            assert r7.is_error and "command" in text_of(r7), r7

            # head/tail as arguments.
            r8 = await s.call_tool("bash", {"command": "seq 1 10", "tail": 2})
            assert text_of(r8) == "9\n10\n", r8

            # Long output: truncated text with the notice; the artifact is a resource.
            r9 = await s.call_tool("bash", {"command": "seq 1 100000"})
            t9 = text_of(r9)
            aid = data(r9)["artifact_id"]
            assert data(r9)["truncated"] and t9.endswith(f"Full: artifact://{aid}]"), t9[-200:]
            listed = [str(x.uri) for x in (await s.list_resources()).resources]
            assert f"artifact://{aid}" in listed and "agent-bash://context" in listed, listed
            templates = [t.uri_template for t in (await s.list_resource_templates()).resource_templates]
            assert templates == ["artifact://{id}"], templates
            full = (await s.read_resource(f"artifact://{aid}")).contents[0].text
            want = subprocess.run(["seq", "1", "100000"], capture_output=True, text=True).stdout
            assert full == want, (len(full), len(want))
            try:
                await s.read_resource("artifact://999")
                raise AssertionError("artifact://999 was readable")
            except Exception as e:  # an MCP error with the exact §4.3 text
                assert f"Artifact 999 not found. Available: {aid}" in str(e), e
    emit(artifact=aid)
    print("ok basics", flush=True)


async def progress(bin_path, state):
    params = server(bin_path, state)
    seen = []

    async def on_progress(value, total, message):
        seen.append((time.monotonic(), value, message))

    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            started = time.monotonic()
            res = await s.call_tool(
                "bash",
                {"command": "for i in 1 2 3 4 5 6 7 8; do echo step$i; sleep 0.25; done"},
                progress_callback=on_progress,
            )
            took = time.monotonic() - started
    assert text_of(res) == "".join(f"step{i}\n" for i in range(1, 9)), res
    assert len(seen) >= 3, seen
    values = [v for _, v, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values), values
    assert all(m and "step" in m and "lines" in m for _, _, m in seen), seen
    # At most 4 per second: consecutive notifications ~250 ms apart as sent. Seen here, a late
    # one followed by one on time comes closer (0.1996 s under a load of 8 on 2 cores): each
    # gap at least 0.15 s, and the rate bound below over the whole run.
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert all(g >= 0.15 for g in gaps), gaps
    assert len(seen) <= took * 4 + 1, (len(seen), took)
    emit(notifications=len(seen), messages=[m for _, _, m in seen])
    print("ok progress", flush=True)


def procs_with_env(needle):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


async def cancel(bin_path, state):
    params = server(bin_path, state)
    mark = f"AGENT_BASH_MCP_MARK={os.getpid()}-{time.time_ns()}"
    command = (
        f"env {mark} setsid sleep 300 & "
        f"env {mark} sh -c \"trap '' TERM; sleep 300; :\" & "
        "sleep 0.2; echo started; wait"
    )
    got_started = anyio.Event()
    outcome = {}

    async def on_progress(value, total, message):
        if message and "started" in message:
            got_started.set()

    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            async with anyio.create_task_group() as tg:

                async def call():
                    outcome["result"] = await s.call_tool("bash", {"command": command}, progress_callback=on_progress)

                tg.start_soon(call)
                with anyio.fail_after(20):
                    await got_started.wait()
                # setsid's sleep, the TERM-ignoring sh and its sleep.
                assert len(procs_with_env(mark)) >= 2, procs_with_env(mark)
                # Abandoning the call makes the SDK send notifications/cancelled.
                tg.cancel_scope.cancel()
            assert "result" not in outcome, outcome
            deadline = time.monotonic() + 10
            while procs_with_env(mark) and time.monotonic() < deadline:
                await anyio.sleep(0.02)
            left = procs_with_env(mark)
            assert not left, f"processes left after cancel: {left}"
            # The server keeps serving.
            again = await s.call_tool("bash", {"command": "echo still here"})
            assert text_of(again) == "still here\n", again
    print("ok cancel", flush=True)


async def call(bin_path, state, command, nvim_addr, revision="legacy"):
    """One call with the editor mirror on; prints the result as JSON. `revision` "legacy": the
    `initialize` handshake (client "test-agent"); "modern": the newest revision, opened with
    `server/discover`, the client named only in each request's `_meta` ("modern-agent")."""
    # "auto": no $NVIM, the server discovers the editor through the registry.
    extra = {} if nvim_addr == "auto" else {"NVIM": nvim_addr}
    params = server(bin_path, state, extra_env=extra, nvim="auto")
    if revision == "modern":
        async with Client(params, client_info=types.Implementation(name="modern-agent", version="1")) as c:
            assert c.protocol_version == "2026-07-28", c.protocol_version
            print("initialized", flush=True)
            res = await c.call_tool("bash", {"command": command})
    else:
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w, client_info=types.Implementation(name="test-agent", version="1")) as s:
                await s.initialize()
                print("initialized", flush=True)
                res = await s.call_tool("bash", {"command": command})
    emit(text=text_of(res), is_error=res.is_error, result=data(res))
    print("ok call", flush=True)


async def list_changed(bin_path, state):
    """`initialize`d session: `resources.listChanged` is declared, a new artifact sends
    `notifications/resources/list_changed`, and `resources/list` names it, newest first."""
    changed = []
    got = anyio.Event()

    async def on_message(m):
        if isinstance(m, types.ResourceListChangedNotification):
            changed.append(m)
            got.set()

    params = server(bin_path, state)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, message_handler=on_message) as s:
            init = await s.initialize()
            assert init.capabilities.resources.list_changed is True, init.capabilities
            r1 = await s.call_tool("bash", {"command": "seq 1 100000"})
            a1 = data(r1)["artifact_id"]
            # The first change of a window is announced before the call answers (the SDK hands
            # messages over in order): a client that refreshes its list on the notification
            # knows the artifact before its model reads the result.
            assert len(changed) == 1, "list_changed did not come before the result"
            got = anyio.Event()
            r2 = await s.call_tool("bash", {"command": "seq 1 200000"})
            a2 = data(r2)["artifact_id"]
            assert a2 > a1, (a1, a2)
            with anyio.fail_after(20):
                await got.wait()
            listed = [str(x.uri) for x in (await s.list_resources()).resources]
            assert listed.index(f"artifact://{a2}") < listed.index(f"artifact://{a1}"), listed
            assert listed[0] == f"artifact://{a2}", listed
    emit(notifications=len(changed))
    print("ok list_changed", flush=True)


async def modern(bin_path, state):
    """The newest revision (no `initialize`: `server/discover`, then self-contained requests):
    calls, resources, and list_changed on a `subscriptions/listen` stream."""
    params = server(bin_path, state)
    async with Client(params, client_info=types.Implementation(name="modern-agent", version="1")) as c:
        assert c.protocol_version == "2026-07-28", c.protocol_version
        assert c.server_capabilities.resources.list_changed is True, c.server_capabilities
        r1 = await c.call_tool("bash", {"command": "export X=kept; echo one; (exit 2)"})
        assert r1.is_error and text_of(r1) == "one\n\nCommand exited with code 2", r1
        assert data(r1)["exit_code"] == 2
        r2 = await c.call_tool("bash", {"command": "echo $X"})
        assert text_of(r2) == "kept\n", r2
        async with c.listen(resources_list_changed=True) as sub:
            r3 = await c.call_tool("bash", {"command": "seq 1 100000"})
            aid = data(r3)["artifact_id"]
            assert text_of(r3).endswith(f"Full: artifact://{aid}]"), text_of(r3)[-200:]
            with anyio.fail_after(20):
                async for _event in sub:
                    break
            listed = [str(x.uri) for x in (await c.list_resources(cache_mode="bypass")).resources]
            assert listed[0] == f"artifact://{aid}", listed
        full = (await c.read_resource(f"artifact://{aid}")).contents[0].text
        want = subprocess.run(["seq", "1", "100000"], capture_output=True, text=True).stdout
        assert full == want, (len(full), len(want))
    print("ok modern", flush=True)


async def changes(bin_path, state, project):
    """contract §13 over MCP: a call's changes in its structured content and text, and bash_undo."""
    params = server(bin_path, state, config_extra="[changes]\nmax_snapshot_ms = 60000\n")
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            undo = tools["bash_undo"]
            jsonschema.Draft202012Validator.check_schema(undo.input_schema)
            assert undo.description and undo.input_schema["properties"]["changes_id"]["description"]
            bash = tools["bash"]

            r1 = await s.call_tool("bash", {"command": "echo new > made.txt; echo more >> kept.txt", "cwd": project})
            sc = data(r1)
            assert sc["changes"] == [
                {"path": "kept.txt", "kind": "modified"},
                {"path": "made.txt", "kind": "added"},
            ], sc
            assert sc["changes_count"] == 2, sc
            assert text_of(r1) == "(no output)\n\n[Changed files: M kept.txt, A made.txt]", text_of(r1)

            u1 = await s.call_tool("bash_undo", {"changes_id": sc["changes_id"]})
            assert not u1.is_error, u1
            assert text_of(u1).startswith(f"Undid run {sc['changes_id']} ("), text_of(u1)
            assert not os.path.exists(os.path.join(project, "made.txt"))
            with open(os.path.join(project, "kept.txt")) as f:
                assert f.read() == "kept\n"
            redo = data(u1)["changes_id"]

            # Undo of the undo; then a refusal once a file changed again.
            u2 = await s.call_tool("bash_undo", {"changes_id": redo})
            assert not u2.is_error and os.path.exists(os.path.join(project, "made.txt")), u2
            with open(os.path.join(project, "made.txt"), "w") as f:
                f.write("edited\n")
            u3 = await s.call_tool("bash_undo", {"changes_id": data(u2)["changes_id"]})
            assert u3.is_error, u3
            assert text_of(u3) == f"Not undone: this file changed since run {data(u2)['changes_id']}: made.txt", text_of(u3)
            assert data(u3) == {"conflicts": ["made.txt"]}, u3
            u4 = await s.call_tool("bash_undo", {"changes_id": "x"})
            assert u4.is_error and "changes_id" in text_of(u4), u4
    print("ok changes", flush=True)


async def structured(bin_path, state, project):
    """`[mcp] structured_content = true` restores the structured shape: the BashResult as
    structured content too, and output schemas it validates against."""
    params = server(bin_path, state, config_extra="[mcp]\nstructured_content = true\n[changes]\nmax_snapshot_ms = 60000\n")
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            bash = tools["bash"]
            jsonschema.Draft202012Validator.check_schema(bash.output_schema)
            r1 = await s.call_tool("bash", {"command": "echo hi; exit 4"})
            assert r1.is_error and text_of(r1) == "hi\n\nCommand exited with code 4", r1
            sc = data(r1, structured=True)
            assert sc["exit_code"] == 4 and sc["output"] == text_of(r1), sc
            jsonschema.validate(sc, bash.output_schema)
            r2 = await s.call_tool("bash", {"command": "echo x > f.txt", "cwd": project})
            jsonschema.validate(data(r2, structured=True), bash.output_schema)
            u = await s.call_tool("bash_undo", {})
            assert not u.is_error, u
            assert data(u, structured=True)["changes_id"], u
    print("ok structured", flush=True)


def main():
    scenario, bin_path, state, *rest = sys.argv[1:]
    fn = {
        "basics": basics,
        "progress": progress,
        "cancel": cancel,
        "call": call,
        "changes": changes,
        "structured": structured,
        "list_changed": list_changed,
        "modern": modern,
    }[scenario]
    anyio.run(fn, bin_path, state, *rest)


if __name__ == "__main__":
    main()
