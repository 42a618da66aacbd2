-- A stand-in for `agent-bash nvim` in specs: speaks msgpack-RPC on stdio like the real
-- backend and acts out scripted commands, so the Lua side is tested without the Rust build.
-- Run as `nvim -ll tests/lua/fake_backend.lua --log-file F nvim --state-dir D`.
--   command 'echo hi'   → one update, then done (exit 0)
--   command 'fail'      → done, exit 1
--   command 'sleep'     → runs until cancelled → done, cancelled
--   command 'many'      → done, truncated, artifact 1
--   command 'badcwd'    → error event
--   command 'die'       → the process exits with code 3
--   command 'pty-echo'  → PTY run: asks the editor for a terminal (terminal._open), writes
--                         `hello from pty` into it, then done (exit 0)
--   command 'pty-sleep' → PTY run: writes `hello from pty`, echoes pty_input into the terminal,
--                         runs until cancelled
-- `pty_log` returns what PTY runs saw: the `_open` answers, pty_input and pty_resize params;
-- `last_run` the params of the last `run`.
-- artifact://1 → a file's path; artifact://8 → string error; others → [type, message] error.
-- The argv it got is available as the `argv` request.

local uv = vim.uv
local stdin, stdout = uv.new_pipe(false), uv.new_pipe(false)
stdin:open(0)
stdout:open(1)
local unpacker = vim.mpack.Unpacker()
local msgid = 1000
local version = os.getenv('FAKE_AGENT_BASH_VERSION') or '0.1.0'
local running = {}
local replies = {} -- msgid → callback(err, result) for requests sent to the editor
local pty_log = { opened = {}, input = {}, resize = {} }
local pty_chan = {} -- run id → terminal channel
local last_run = nil

local function send(msg)
  stdout:write(vim.mpack.encode(msg))
end

local function event(ev)
  msgid = msgid + 1
  send({ 0, msgid, 'nvim_exec_lua', { "require('agent_bash.backend')._on_event(...)", { ev } } })
end

local function result(over)
  local r = {
    output = '',
    exit_code = 0,
    cancelled = false,
    timed_out = false,
    truncated = false,
    total_lines = 0,
    total_bytes = 0,
    output_lines = 0,
    output_bytes = 0,
    duration_ms = 3,
    is_error = false,
    shell_restarted = false,
  }
  for k, v in pairs(over) do
    r[k] = v
  end
  return r
end

local function call(method, args, cb)
  msgid = msgid + 1
  replies[msgid] = cb
  send({ 0, msgid, method, args })
end

local function pty_run(id, p)
  local code = "return require('agent_bash.terminal')._open(...)"
  call('nvim_exec_lua', { code, { id, { command = p.command, origin = p.origin } } }, function(err, res)
    if err ~= vim.NIL then
      event({ type = 'error', id = id, message = 'PTY error: ' .. vim.inspect(err) })
      return
    end
    table.insert(pty_log.opened, res)
    pty_chan[id] = res.chan
    call('nvim_chan_send', { res.chan, 'hello from pty\r\n' }, function() end)
    event({ type = 'update', id = id, lines = { 'hello from pty' }, hl = {}, total_lines = 1, total_bytes = 15, elapsed_ms = 1 })
    if p.command == 'pty-echo' then
      event({ type = 'done', id = id, lines = { 'hello from pty' }, hl = {}, result = result({ output = 'hello from pty\n', total_lines = 1, total_bytes = 15, output_lines = 1, output_bytes = 15 }) })
    else
      running[id] = true
    end
  end)
end

local function run(p)
  local id, cmd = p.id, p.command
  last_run = p
  if cmd:find('^pty%-') then
    pty_run(id, p)
  elseif cmd == 'echo hi' then
    event({ type = 'update', id = id, lines = { 'hi' }, hl = { { 0, 0, 2, { fg = 2 } } }, total_lines = 1, total_bytes = 3, elapsed_ms = 1 })
    event({ type = 'done', id = id, lines = { 'hi' }, hl = { { 0, 0, 2, { fg = 2 } } }, result = result({ output = 'hi\n', total_lines = 1, total_bytes = 3, output_lines = 1, output_bytes = 3 }) })
  elseif cmd == 'fail' then
    event({ type = 'done', id = id, lines = { 'oops' }, hl = {}, result = result({ output = 'oops\n\nCommand exited with code 1', exit_code = 1, is_error = true, total_lines = 1 }) })
  elseif cmd == 'sleep' then
    running[id] = true
    event({ type = 'update', id = id, lines = { 'zzz' }, hl = {}, total_lines = 1, total_bytes = 4, elapsed_ms = 5 })
  elseif cmd == 'many' then
    local lines = {}
    for i = 91, 100 do
      lines[#lines + 1] = 'line ' .. i
    end
    event({ type = 'done', id = id, lines = lines, hl = {}, result = result({ output = '…', total_lines = 100, output_lines = 10, truncated = true, artifact_id = 1 }) })
  elseif cmd == 'badcwd' then
    event({ type = 'error', id = id, message = 'Working directory does not exist: /nope' })
  elseif cmd == 'die' then
    os.exit(3)
  end
end

local function request(id, method, p)
  if method == 'hello' then
    send({ 1, id, vim.NIL, { version = version, pid = uv.os_getpid(), session_dir = '/tmp/fake-artifacts', got = p.version } })
  elseif method == 'ping' then
    send({ 1, id, vim.NIL, 'pong' })
  elseif method == 'pty_log' then
    send({ 1, id, vim.NIL, pty_log })
  elseif method == 'last_run' then
    send({ 1, id, vim.NIL, last_run or vim.NIL })
  elseif method == 'argv' then
    send({ 1, id, vim.NIL, { unpack(_G.arg) } })
  elseif method == 'artifact_path' then
    if p.url == 'artifact://1' then
      -- Like the backend: the path of a file Neovim reads itself.
      local text = {}
      for i = 1, 100 do
        text[i] = 'line ' .. i
      end
      local path = os.tmpname()
      local f = assert(io.open(path, 'w'))
      f:write(table.concat(text, '\n') .. '\n')
      f:close()
      send({ 1, id, vim.NIL, path })
    elseif p.url == 'artifact://8' then
      send({ 1, id, 'Artifact 8 not found. Available: 1', vim.NIL })
    else
      send({ 1, id, { 0, 'artifact:// ID must be numeric, got: ' .. p.url:gsub('^artifact://', '') }, vim.NIL })
    end
  else
    send({ 1, id, { 0, 'unknown method ' .. method }, vim.NIL })
  end
end

local function notification(method, p)
  if method == 'run' then
    run(p)
  elseif method == 'cancel' and running[p.id] then
    running[p.id] = nil
    event({ type = 'done', id = p.id, lines = { 'zzz' }, hl = {}, result = result({ output = '[Command cancelled]\n\nzzz', exit_code = vim.NIL, cancelled = true, is_error = true, total_lines = 1 }) })
  elseif method == 'pty_input' then
    table.insert(pty_log.input, p)
    if running[p.id] and pty_chan[p.id] then
      call('nvim_chan_send', { pty_chan[p.id], p.data }, function() end)
    end
  elseif method == 'pty_resize' then
    table.insert(pty_log.resize, p)
  end
end

local buffer = ''
stdin:read_start(function(err, data)
  if err or not data then
    os.exit(0) -- stdin closed: the editor left
  end
  buffer = buffer .. data
  local pos = 1
  while pos <= #buffer do
    local msg, next_pos = unpacker(buffer, pos)
    pos = next_pos
    if msg == nil then
      break
    end
    if msg[1] == 0 then
      request(msg[2], msg[3], msg[4][1] or {})
    elseif msg[1] == 1 then
      local cb = replies[msg[2]]
      replies[msg[2]] = nil
      if cb then
        cb(msg[3], msg[4])
      end
    elseif msg[1] == 2 then
      notification(msg[2], msg[3][1] or {})
    end
  end
  buffer = ''
end)

uv.run()
