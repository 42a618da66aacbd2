-- The editor mirror (contract §11): an MCP server (`agent-bash mcp`) started by any agent shows the
-- commands it runs as tool cards in this editor. The server finds the editor ($NVIM, `--nvim
-- ADDRESS`, or the discovery registry kept here), connects to its RPC address and drives cards
-- through `hello`, `open` and `event` with nvim_exec_lua. The commands run in the server's own
-- processes: cancelling such a card notifies the server (`cancel {key}`), which cancels the call.
--
-- Registry: one JSON file per editor, `<state>/agent-bash/editors/<pid>.json` with `address`,
-- `pid`, `cwd` and `started`, where <state> is the state dir the backend uses
-- (`$XDG_STATE_HOME`, else `~/.local/state`). plugin/agent_bash.lua writes it after start-up
-- (without loading this module), keeps it current on `:cd` and removes it on VimLeavePre;
-- entries of editors that died are removed by the next one to start.

local M = {}
local H = {}

local log = require('agent_bash.log')

---@class agent_bash.MirrorServer
---@field chan integer the server's RPC channel into this editor
---@field pid integer the server's process id
---@field cwd string the server's working directory
---@field client? string the MCP client's name (from its `initialize`)
---@field version? string the server's version
---@field calls integer calls shown so far
---@field since integer os.time() of the connection

--- The directory of the discovery registry (the same as plugin/agent_bash.lua's).
---@return string
function M.registry_dir()
  local base = vim.env.XDG_STATE_HOME
  if base == nil or base == '' or not base:match('^/') then
    if vim.fn.has('mac') == 1 then
      base = (vim.env.HOME or '') .. '/Library/Application Support'
    else
      base = (vim.env.HOME or '') .. '/.local/state'
    end
  end
  return base .. '/agent-bash/editors'
end

--- Called by a server once connected. Returns what it needs to know of this editor.
---@param info {chan: integer, pid: integer, cwd: string, version?: string, client?: string}
---@return table
function M.hello(info)
  info = require('agent_bash.backend').denil(info)
  H.servers[info.chan] = {
    chan = info.chan,
    pid = info.pid,
    cwd = info.cwd,
    version = info.version,
    client = info.client,
    calls = 0,
    since = os.time(),
  }
  log.info('mirror: MCP server pid %s (cwd %s) on channel %d', tostring(info.pid), tostring(info.cwd), info.chan)
  H.watch()
  return { version = require('agent_bash').version, pid = vim.fn.getpid() }
end

---@class agent_bash.MirrorSpec
---@field chan integer the server's channel (for the cancel notification)
---@field key integer the server's call number
---@field command string
---@field cwd? string absolute working directory of the call
---@field timeout? number
---@field client? string

--- Opens a card for a call the server runs. Returns the run id events will carry.
---@param spec agent_bash.MirrorSpec
---@return integer
function M.open(spec)
  spec = require('agent_bash.backend').denil(spec)
  local server = H.servers[spec.chan]
  if server then
    server.calls = server.calls + 1
    server.client = spec.client or server.client
  end
  local root = vim.fn.getcwd()
  local run = require('agent_bash.runs').attach({
    origin = 'tool',
    command = spec.command,
    cwd_label = spec.cwd and require('agent_bash.card').cwd_label(spec.cwd, root) or nil,
    timeout = spec.timeout,
    client = spec.client or 'MCP',
    card = require('agent_bash.config').options.card.show_tool_cards,
  }, function()
    pcall(vim.rpcnotify, spec.chan, 'cancel', { key = spec.key })
  end)
  run.remote_chan = spec.chan
  return run.id
end

--- An event of a mirrored call (the nvim mode's events: `update`, `done`, `error`).
---@param ev table
function M.event(ev)
  require('agent_bash.backend')._on_event(ev)
end

--- The agent's context (contract §10) of this editor, for the server's `agent-bash://context`.
---@return agent_bash.ContextMessage[]
function M.context()
  local msgs, err = require('agent_bash').context()
  if not msgs then
    error(err or 'no context')
  end
  return msgs
end

--- The full text of a mirrored call's artifact (a file of the MCP server's session). Returns
--- true and the text, or false and the error.
---@param path string
---@return boolean ok
---@return string text_or_err
function M.read_artifact(path)
  local f, err = io.open(path, 'rb')
  if not f then
    return false, 'agent-bash: cannot read the MCP server\'s artifact: ' .. tostring(err)
  end
  local text = f:read('*a')
  f:close()
  return true, text
end

--- The servers mirrored into this editor that are still connected.
---@return agent_bash.MirrorServer[]
function M.servers()
  local out = {}
  for chan, s in pairs(H.servers) do
    if H.alive(chan) then
      out[#out + 1] = s
    else
      H.servers[chan] = nil
    end
  end
  table.sort(out, function(a, b)
    return a.chan < b.chan
  end)
  return out
end

-- Helpers -----------------------------------------------------------------------------------

H.servers = {} ---@type table<integer, agent_bash.MirrorServer>

function H.alive(chan)
  local ok, info = pcall(vim.api.nvim_get_chan_info, chan)
  return ok and type(info) == 'table' and info.id ~= nil
end

--- While servers are connected, checks every second that they still are: the cards of a
--- server that went away mid-call say so instead of running forever.
function H.watch()
  if H.timer then
    return
  end
  H.timer = vim.uv.new_timer()
  H.timer:start(
    1000,
    1000,
    vim.schedule_wrap(function()
      for chan in pairs(H.servers) do
        if not H.alive(chan) then
          H.servers[chan] = nil
          require('agent_bash.runs').fail_remote(chan, 'the MCP server went away')
        end
      end
      if next(H.servers) == nil and H.timer then
        H.timer:stop()
        H.timer:close()
        H.timer = nil
      end
    end)
  )
end

return M
