"""Drives a real coding agent (Claude Code, Codex or Gemini CLI) through a scripted model of ours.

Usage: drive.py AGENT SPEC_JSON OUT_JSON, run inside a network namespace of the test's own where
only `lo` is up (tests/suite/agents.rs starts it with `unshare -n`), so no request can leave the
machine. AGENT is `claude`, `codex` or `gemini`. SPEC_JSON (a file) says:
  bin_dir      where scripts/agents.sh installed the agents (node_modules/.bin)
  agent_bash   the agent-bash binary the agent registers as its MCP server
  work         a directory for the run: the agent works in `proj/` with HOME `home/` beside it
  steps        what the model does, one step per model turn: {"bash": {tool arguments}} calls
               our `bash` tool, {"read_artifact": true} reads the `artifact://<id>` named in the
               last tool result through the agent's own resource tool; then the model answers
               `done.`
  nvim         (optional) the editor's address, passed to `agent-bash mcp --nvim`
  env          (optional) extra environment for the agent (a marker the test looks processes up by)
  cancel_after (optional) once the model has asked for that many tool calls and a process with
               env `cancel_mark` runs, the agent gets SIGINT, as from Ctrl-C in its terminal
The scripted model is an HTTP server on 127.0.0.1 speaking the agent's own wire format (Anthropic
Messages, OpenAI Responses or the Gemini API, each streamed as server-sent events). It records
every request; OUT_JSON gets {requests, results, agent: {rc, stdout, stderr}, tools}, where
`results` are the tool results the model received, in order, exactly as the agent sent them.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARTIFACT = re.compile(r"artifact://\d+")


class Model:
    """The script: which step comes next is read off the conversation the agent sends, so a
    request the agent retries or sends twice gets the same answer."""

    def __init__(self, spec):
        self.steps = spec["steps"]
        self.requests = []
        self.lock = threading.Lock()
        self.calls_asked = 0
        self.errors = []
        # The MCP server's log, for an agent that reads only resources it has listed.
        self.server_log = None

    def wait_listed(self, uri, within=20.0):
        """Waits until the server has answered a `resources/list` naming `uri` first, as a real
        model's seconds of thinking let the agent's refresh on `list_changed` finish; a scripted
        model answers in a millisecond and would outrun it."""
        line = f"mcp: resources/list answered: {uri}\n"
        end = time.monotonic() + within
        while time.monotonic() < end:
            try:
                with open(self.server_log) as f:
                    if any(l.endswith(line) for l in f):
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"the agent never listed {uri} (server log {self.server_log})")

    def next_step(self, n_calls, results):
        """The step after `n_calls` tool calls whose results so far are `results` (texts)."""
        if n_calls >= len(self.steps):
            return None
        step = self.steps[n_calls]
        if "read_artifact" in step:
            found = ARTIFACT.findall(results[-1] if results else "")
            assert found, f"no artifact:// in the last result: {results[-1:]!r}"
            if self.server_log:
                self.wait_listed(found[-1])
            return {"read": found[-1]}
        return {"bash": step["bash"]}


# Anthropic Messages (Claude Code) ---------------------------------------------------------------


class Claude:
    bash_tool = "mcp__agent-bash__bash"

    @staticmethod
    def results(body):
        out = []
        for m in body.get("messages", []):
            if m.get("role") != "user" or not isinstance(m.get("content"), list):
                continue
            for block in m["content"]:
                if block.get("type") == "tool_result":
                    out.append(block.get("content"))
        return out

    @staticmethod
    def result_text(raw):
        if isinstance(raw, str):
            return raw
        return "".join(b.get("text", "") for b in raw or [] if b.get("type") == "text")

    @staticmethod
    def tools(body):
        return [t.get("name") for t in body.get("tools", [])]

    @classmethod
    def is_main(cls, body):
        return cls.bash_tool in cls.tools(body)

    @staticmethod
    def n_calls(body):
        return sum(
            1
            for m in body.get("messages", [])
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_use"
        )

    @classmethod
    def call(cls, step, body, n):
        if "bash" in step:
            return cls.bash_tool, step["bash"]
        return "ReadMcpResourceTool", {"server": "agent-bash", "uri": step["read"]}

    @staticmethod
    def respond(handler, body, call, n):
        model = body.get("model", "stub")
        if call is None:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": "done."}
            stop = "end_turn"
        else:
            block = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": call[0], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(call[1])}
            stop = "tool_use"
        if not body.get("stream"):
            content = dict(block)
            if call is None:
                content["text"] = "done."
            else:
                content["input"] = call[1]
            return handler.send_json(
                {
                    "id": f"msg_{n}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [content],
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
            )
        usage = {"input_tokens": 1, "output_tokens": 1}
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        events = [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 1}},
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        handler.send_sse(events)

    @staticmethod
    def run(spec, base, home):
        cfg = os.path.join(home, "mcp.json")
        args = ["mcp"] + (["--nvim", spec["nvim"]] if spec.get("nvim") else [])
        with open(cfg, "w") as f:
            json.dump({"mcpServers": {"agent-bash": {"command": spec["agent_bash"], "args": args}}}, f)
        env = {
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "ENABLE_TOOL_SEARCH": "false",
            "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
        }
        argv = [
            os.path.join(spec["bin_dir"], "claude"),
            "-p",
            "Run the commands you are asked for.",
            "--mcp-config",
            cfg,
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__agent-bash__bash,ReadMcpResourceTool",
            "--output-format",
            "json",
        ]
        return argv, env


# OpenAI Responses (Codex) -----------------------------------------------------------------------


class Codex:
    namespace = "mcp__agent_bash"

    @staticmethod
    def results(body):
        return [i.get("output") for i in body.get("input", []) if i.get("type") == "function_call_output"]

    @staticmethod
    def result_text(raw):
        if isinstance(raw, str):
            return raw
        if isinstance(raw, list):
            return "".join(c.get("text", "") for c in raw if isinstance(c, dict))
        return json.dumps(raw)

    @staticmethod
    def tools(body):
        names = []
        for t in body.get("tools", []):
            names.append(t.get("name") or t.get("type"))
            for sub in t.get("tools", []) or []:
                names.append(f"{t.get('name')}/{sub.get('name')}")
        return names

    @classmethod
    def is_main(cls, body):
        return any(n.startswith(cls.namespace) for n in cls.tools(body) if n)

    @staticmethod
    def n_calls(body):
        return sum(1 for i in body.get("input", []) if i.get("type") == "function_call")

    @classmethod
    def call(cls, step, body, n):
        if "bash" in step:
            return (cls.namespace, "bash"), step["bash"]
        return (None, "read_mcp_resource"), {"server": "agent-bash", "uri": step["read"]}

    @staticmethod
    def respond(handler, body, call, n):
        rid = f"resp_{n}"
        if call is None:
            item = {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{n}",
                "content": [{"type": "output_text", "text": "done.", "annotations": []}],
            }
        else:
            (namespace, name), args = call
            item = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n:04d}",
                "name": name,
                "arguments": json.dumps(args),
            }
            if namespace:
                item["namespace"] = namespace
        usage = {
            "input_tokens": 1,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 2,
        }
        events = [
            ("response.created", {"type": "response.created", "response": {"id": rid}}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": {"id": rid, "usage": usage}}),
        ]
        handler.send_sse(events)

    @staticmethod
    def run(spec, base, home):
        codex_home = os.path.join(home, ".codex")
        os.makedirs(codex_home, exist_ok=True)
        args = ["mcp"] + (["--nvim", spec["nvim"]] if spec.get("nvim") else [])
        with open(os.path.join(codex_home, "config.toml"), "w") as f:
            f.write(
                'model = "stub-model"\n'
                'model_provider = "stub"\n'
                "[model_providers.stub]\n"
                'name = "stub"\n'
                f'base_url = "{base}/v1"\n'
                'env_key = "STUB_API_KEY"\n'
                'wire_api = "responses"\n'
                "[mcp_servers.agent-bash]\n"
                f"command = {json.dumps(spec['agent_bash'])}\n"
                f"args = {json.dumps(args)}\n"
                # Without it `codex exec` (approval policy "never") refuses every MCP call.
                'default_tools_approval_mode = "approve"\n'
            )
        env = {"CODEX_HOME": codex_home, "STUB_API_KEY": "not-a-key"}
        argv = [
            os.path.join(spec["bin_dir"], "codex"),
            "exec",
            "--skip-git-repo-check",
            "--json",
            "Run the commands you are asked for.",
        ]
        return argv, env


def filler(schema):
    """A value that satisfies a (Gemini-style) JSON schema: the first enum value, 1, "stub"."""
    kind = str(schema.get("type", "object")).lower()
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: filler(v) for k, v in props.items()}
    if kind == "array":
        return [filler(schema.get("items") or {"type": "string"})]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return False
    return "stub"


# Gemini API (Gemini CLI) ------------------------------------------------------------------------


class Gemini:
    bash_tool = None  # learned from the declarations the agent sends

    @staticmethod
    def parts(body, role):
        for c in body.get("contents", []):
            if c.get("role") == role:
                for p in c.get("parts", []):
                    yield p

    @classmethod
    def results(cls, body):
        return [p["functionResponse"] for p in cls.parts(body, "user") if "functionResponse" in p]

    @staticmethod
    def result_text(raw):
        return json.dumps(raw)

    @staticmethod
    def tools(body):
        return [d.get("name") for t in body.get("tools", []) or [] for d in t.get("functionDeclarations", []) or []]

    @classmethod
    def is_main(cls, body):
        return any(n and n.endswith("bash") and "agent" in n for n in cls.tools(body))

    @classmethod
    def n_calls(cls, body):
        return sum(1 for p in cls.parts(body, "model") if "functionCall" in p)

    @classmethod
    def call(cls, step, body, n):
        names = cls.tools(body)
        if "bash" in step:
            name = next(n for n in names if n.endswith("bash") and "agent" in n)
            return name, step["bash"]
        name = next((n for n in names if "resource" in n and "read" in n), None)
        assert name, f"no resource tool among {names}"
        return name, {"uri": step["read"]}

    @staticmethod
    def respond(handler, body, call, n):
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        if call is None and schema:
            # The agent's own side questions (e.g. its model router's) want JSON of a schema.
            parts = [{"text": json.dumps(filler(schema))}]
        elif call is None:
            parts = [{"text": "done."}]
        else:
            parts = [{"functionCall": {"name": call[0], "args": call[1]}}]
        chunk = {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
            "modelVersion": "stub",
        }
        if "countTokens" in handler.path:
            return handler.send_json({"totalTokens": 1})
        if "streamGenerateContent" in handler.path:
            return handler.send_sse([(None, chunk)])
        handler.send_json(chunk)

    @staticmethod
    def run(spec, base, home):
        gdir = os.path.join(home, ".gemini")
        os.makedirs(gdir, exist_ok=True)
        # Gemini CLI reads only resources it listed: the model waits for that (Model.wait_listed).
        log = os.path.join(spec["work"], "mcp-server.log")
        Handler.model.server_log = log
        args = ["mcp"] + (["--nvim", spec["nvim"]] if spec.get("nvim") else [])
        settings = {
            "mcpServers": {
                "agent-bash": {
                    "command": spec["agent_bash"],
                    "args": args,
                    "trust": True,
                    "env": {"AGENT_BASH_LOG": log, "AGENT_BASH_LOG_LEVEL": "info,agent_bash::mode::mcp=debug"},
                }
            },
            "security": {"auth": {"selectedType": "gemini-api-key"}},
        }
        with open(os.path.join(gdir, "settings.json"), "w") as f:
            json.dump(settings, f)
        env = {"GEMINI_API_KEY": "not-a-key", "GOOGLE_GEMINI_BASE_URL": base, "GEMINI_CLI_TRUST_WORKSPACE": "true"}
        argv = [
            os.path.join(spec["bin_dir"], "gemini"),
            "-p",
            "Run the commands you are asked for.",
            "--approval-mode",
            "yolo",
            "--output-format",
            "json",
        ]
        return argv, env


AGENTS = {"claude": Claude, "codex": Codex, "gemini": Gemini}


# The HTTP side ----------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model = None
    agent = None

    def log_message(self, *args):
        pass

    def send_json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_sse(self, events):
        chunks = []
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            chunks.append(f"{head}data: {json.dumps(data)}\n\n")
        data = "".join(chunks).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.record(None)
        self.send_json({"data": [], "models": []})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        self.record(body)
        agent, model = self.agent, self.model
        if not agent.is_main(body):
            return agent.respond(self, body, None, 0)
        n_calls = agent.n_calls(body)
        texts = [agent.result_text(r) for r in agent.results(body)]
        try:
            step = model.next_step(n_calls, texts)
            call = None if step is None else agent.call(step, body, n_calls)
        except Exception as e:  # the script went wrong: the model ends, the test sees why
            with model.lock:
                model.errors.append(repr(e))
            step = call = None
        with model.lock:
            model.calls_asked = max(model.calls_asked, n_calls + (call is not None))
        agent.respond(self, body, call, n_calls)

    def record(self, body):
        with self.model.lock:
            self.model.requests.append({"method": self.command, "path": self.path, "body": body})


def procs_with_env(needle):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle.encode() in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def main():
    name, spec_path, out_path = sys.argv[1:4]
    with open(spec_path) as f:
        spec = json.load(f)
    agent = AGENTS[name]
    model = Model(spec)
    Handler.model, Handler.agent = model, agent
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    home = os.path.join(spec["work"], "home")
    project = os.path.join(spec["work"], "proj")
    os.makedirs(home, exist_ok=True)
    os.makedirs(project, exist_ok=True)
    argv, agent_env = agent.run(spec, base, home)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "TERM": "dumb",
        "LANG": "C.UTF-8",
        "XDG_STATE_HOME": os.path.join(home, ".local/state"),
        "XDG_CONFIG_HOME": os.path.join(home, ".config"),
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "XDG_DATA_HOME": os.path.join(home, ".local/share"),
    }
    env.update(agent_env)
    env.update(spec.get("env") or {})
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=project,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    cancelled = None
    if spec.get("cancel_after"):
        end = time.monotonic() + 120
        while time.monotonic() < end and proc.poll() is None:
            if model.calls_asked >= spec["cancel_after"] and procs_with_env(spec["cancel_mark"]):
                break
            time.sleep(0.02)
        # Ctrl-C in the agent's terminal: SIGINT to its foreground process group.
        os.killpg(proc.pid, signal.SIGINT)
        cancelled = time.time()
    killed = False
    try:
        stdout, stderr = proc.communicate(timeout=30 if cancelled else 240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        killed = True
        stdout, stderr = proc.communicate()
    server.shutdown()
    main_requests = [r["body"] for r in model.requests if r["body"] and agent.is_main(r["body"])]
    last = main_requests[-1] if main_requests else {}
    out = {
        "requests": model.requests,
        "results": agent.results(last),
        "tools": agent.tools(last),
        "cancelled_at": cancelled,
        "errors": model.errors,
        "agent": {
            "rc": proc.returncode,
            "killed": killed,
            "stdout": stdout.decode("utf-8", "replace"),
            "stderr": stderr.decode("utf-8", "replace"),
        },
    }
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
