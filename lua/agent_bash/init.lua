-- agent-bash: shell commands for coding agents and for the user, run by a Rust backend.
-- Public API. Works without setup(); setup(opts) only merges configuration.

local M = {}
local H = {}

--- The Lua plugin's version, compared with the backend's on start.
M.version = '0.1.0'

--- Merges options into the configuration (see `:h agent_bash-config`). Optional.
---@param opts? table
function M.setup(opts)
  local config = require('agent_bash.config')
  local before = config.options.settings_file
  config.setup(opts)
  -- A running backend read the old settings: it restarts with the new ones (once the commands
  -- it runs have ended). Not started yet: it reads them when it starts.
  local backend = package.loaded['agent_bash.backend']
  if config.options.settings_file ~= before and backend and backend.info().chan then
    backend.restart()
  end
end

--- Restarts the backend so that it reads its settings file again, once the commands it runs
--- have ended (`:AgentBashRestart`).
function M.restart()
  require('agent_bash.backend').restart()
end

---@class agent_bash.RunOpts
---@field exclude? boolean exclude from the agent's context (`:AgentBash!`); the card is dimmed
---@field pty? boolean run in a pseudo-terminal shown in a terminal float (`:AgentBashTerm`)

--- Runs a bang command (the user's own) in the current directory and shows its card (or, with
--- `pty`, its terminal). Runs side by side: a second command while one runs starts at once, in
--- its own card and its own shell (SPEC §8.2). The card takes the cursor only with
--- `card.enter = true`.
---@param cmd string
---@param opts? agent_bash.RunOpts
---@return integer id the run's id
function M.run(cmd, opts)
  local validate = require('agent_bash.config').validate
  validate('cmd', cmd, function(c)
    return type(c) == 'string' and vim.trim(c) ~= ''
  end, false, 'a non-empty command')
  validate('opts', opts, 'table', true)
  opts = opts or {}
  -- A per-buffer or global remote profile (SPEC §12), else the settings' default: on this
  -- machine the command starts in the editor's directory; over there (the backend knows which
  -- profile applies) where the session's shell is (`local_cwd`).
  local run = require('agent_bash.runs').start({
    origin = 'bang',
    command = cmd,
    cwd = vim.fn.getcwd(),
    local_cwd = true,
    profile = H.profile(),
    exclude = opts.exclude and true or false,
    pty = opts.pty and true or nil,
    enter = require('agent_bash.config').options.card.enter,
  })
  return run.id
end

--- `:AgentBash {cmd}` and `:AgentBashTerm {cmd}`: expands `%`, `#`, `<cword>`, `<cfile>` as `:!`
--- does (see |agent_bash-expand|); with no {cmd}, runs the last command again (`:!!`).
--- Errors (nothing to repeat, no file name for `%`) are reported, nothing runs.
---@param args string the command line as typed
---@param opts? agent_bash.RunOpts
---@return integer? id
function M.command(args, opts)
  local cmdline = require('agent_bash.cmdline')
  local cmd, err
  if vim.trim(args) == '' then
    cmd, err = cmdline.last()
  else
    cmd, err = cmdline.expand(args)
  end
  if not cmd then
    vim.notify('agent-bash: ' .. err, vim.log.levels.ERROR)
    return nil
  end
  cmdline.remember(cmd)
  return M.run(cmd, opts)
end

--- Cancels the newest running bang command. Returns false (and says so) when none runs.
---@return boolean
function M.cancel()
  local run = require('agent_bash.runs').bang()
  if not run then
    vim.notify('agent-bash: no bash command is running', vim.log.levels.INFO)
    return false
  end
  require('agent_bash.runs').cancel(run)
  return true
end

---@class agent_bash.Handle
---@field id integer
---@field cancel fun(self: agent_bash.Handle) cancel the call; safe to call twice or after it ended

--- Runs an agent's tool call (SPEC §9). `on_done(result)` is called exactly once with the
--- BashResult (an error result if the call could not run); `on_update(update)` with live,
--- throttled tails while it runs.
---@param params agent_bash.ToolParams
---@param callbacks agent_bash.ToolCallbacks
---@return agent_bash.Handle
function M.tool_call(params, callbacks)
  H.validate_tool_call(params, callbacks)
  local root = vim.fn.getcwd()
  local remote = params.profile ~= nil and params.profile ~= 'local'
  local run = require('agent_bash.runs').start({
    origin = 'tool',
    command = params.command,
    -- A remote cwd is a path over there: sent as given. Without a profile the settings may
    -- still send the call elsewhere (`default_profile`): the backend then uses `remote_cwd`.
    cwd = remote and params.cwd or H.resolve_cwd(params.cwd, root),
    local_cwd = not remote or nil,
    remote_cwd = not remote and params.cwd or nil,
    cwd_label = remote and params.cwd or require('agent_bash.card').cwd_label(params.cwd, root),
    profile = params.profile,
    timeout = params.timeout,
    head = params.head,
    tail = params.tail,
    tools = params.tools,
    session_key = params.session_key,
    on_update = callbacks.on_update,
    on_done = callbacks.on_done,
    card = require('agent_bash.config').options.card.show_tool_cards,
    ui = #vim.api.nvim_list_uis() > 0,
  })
  return {
    id = run.id,
    cancel = function()
      require('agent_bash.runs').cancel(run)
    end,
  }
end

--- The agent's context (SPEC §10): `{role = 'user', content}` per recorded, non-excluded bang
--- command of this editor session, oldest first, worded by the backend, one page at a time:
--- at most `opts.limit` (default 50, at most 200) from index `opts.offset` (0-based), or the
--- last page when `offset` is omitted. Returns the messages, nil and the total count; nil and
--- the error message when the backend cannot answer.
---@param opts? {offset?: integer, limit?: integer}
---@return agent_bash.ContextMessage[]? messages
---@return string? err
---@return integer? total
function M.context(opts)
  return require('agent_bash.context').context(opts)
end

--- Recorded bang commands of this editor session, oldest first, paged like context() (see
--- |agent_bash-history|). Returns the entries, nil and the total count.
---@param opts? {offset?: integer, limit?: integer}
---@return agent_bash.HistoryEntry[]? entries
---@return string? err
---@return integer? total
function M.history(opts)
  return require('agent_bash.context').history(opts)
end

--- For agent plugins: the agent is busy (streaming a reply). While busy, the messages of
--- finished bang commands are queued instead of handed to the `on_context` hook.
---@param busy boolean
function M.set_agent_busy(busy)
  require('agent_bash.context').set_agent_busy(busy)
end

--- For agent plugins: `fn(msg)` is called with the message of each non-excluded bang command
--- that finishes while the agent is idle (nil unregisters).
---@param fn? fun(msg: agent_bash.ContextMessage)
function M.on_context(fn)
  require('agent_bash.context').on_context(fn)
end

--- For agent plugins: the messages queued while the agent was busy (or with no hook), oldest
--- first; the queue is emptied. Call it before sending the next prompt.
---@return agent_bash.ContextMessage[]
function M.take_pending()
  return require('agent_bash.context').take_pending()
end

--- Undoes the file changes of run `changes_id` (a result's `changes_id`; nil: the newest run
--- that changed files), without asking (SPEC §13, |agent_bash-undo|). Returns the undo's
--- result (itself undoable by its `changes_id`), or nil and the refusal naming the files
--- changed since.
---@param changes_id? integer
---@return table? result
---@return string? err
function M.undo(changes_id)
  return require('agent_bash.changes').undo(changes_id)
end

--- The files run `changes_id` changed (nil: the newest run that changed files):
--- `{id, root, command, changes = {{path, kind}, …}}`, or nil and an error message.
---@param changes_id? integer
---@return agent_bash.ChangeRecord? record
---@return string? err
function M.changes(changes_id)
  return require('agent_bash.changes').get(changes_id)
end

--- Moves the cursor into the running terminal, else the newest card.
function M.focus()
  if not require('agent_bash.terminal').focus() then
    require('agent_bash.float').focus()
  end
end

--- Collapses or expands the newest card.
function M.toggle()
  local cards = require('agent_bash.float').cards()
  if #cards > 0 then
    require('agent_bash.float').toggle(cards[#cards])
  end
end

--- Closes every card (their commands keep running).
function M.close_all()
  local float = require('agent_bash.float')
  for _, card in ipairs(float.cards()) do
    float.close(card)
  end
end

-- Helpers -----------------------------------------------------------------------------------

function H.validate_tool_call(params, callbacks)
  local validate = require('agent_bash.config').validate
  validate('params', params, 'table')
  validate('params.command', params.command, function(c)
    return type(c) == 'string' and vim.trim(c) ~= ''
  end, false, 'a non-empty string')
  validate('params.timeout', params.timeout, 'number', true)
  validate('params.cwd', params.cwd, 'string', true)
  local count = function(n)
    return type(n) == 'number' and n >= 1 and math.floor(n) == n
  end
  validate('params.head', params.head, count, true, 'a positive integer')
  validate('params.tail', params.tail, count, true, 'a positive integer')
  validate('params.tools', params.tools, function(t)
    return type(t) == 'table' and vim.iter(t):all(function(x)
      return type(x) == 'string'
    end)
  end, true, 'a list of tool names')
  validate('params.session_key', params.session_key, 'string', true)
  validate('params.profile', params.profile, 'string', true)
  validate('callbacks', callbacks, 'table')
  validate('callbacks.on_done', callbacks.on_done, 'callable')
  validate('callbacks.on_update', callbacks.on_update, 'callable', true)
end

--- The remote profile of bang commands: `vim.b.agent_bash_profile`, else
--- `vim.g.agent_bash_profile` (an empty string means none).
---@return string?
function H.profile()
  local b, g = vim.b.agent_bash_profile, vim.g.agent_bash_profile
  if type(b) == 'string' and b ~= '' then
    return b
  end
  if type(g) == 'string' and g ~= '' then
    return g
  end
  return nil
end

--- The directory sent to the backend: absolute, relative paths joined to the project root.
--- `~` is left for the backend to expand (it reports errors with the absolute path).
function H.resolve_cwd(cwd, root)
  if cwd == nil or cwd == '' then
    return root
  end
  if cwd:match('^[/~]') then
    return cwd
  end
  return root .. '/' .. cwd
end

return M
