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
---@field range? [integer, integer] `:{range}AgentBash {filter}`: lines (1-based, inclusive) of the current buffer the command filters, as `:{range}!`

--- Runs a bang command (the user's own) in the current directory and shows its card (or, with
--- `pty`, its terminal). Runs side by side: a second command while one runs starts at once, in
--- its own card and its own shell (contract §8.2). The card takes the cursor only with
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
  -- A per-buffer or global remote profile (contract §12), else the settings' default: on this
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
  if run.finished and not require('agent_bash.backend').bin() then
    -- No binary yet: the card and message say how to build it; :AgentBashBuild then runs this.
    require('agent_bash.build').wait(function()
      M.run(cmd, opts)
    end)
  end
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
  H.autowrite()
  if opts and opts.range then
    return H.filter(cmd, opts)
  end
  return M.run(cmd, opts)
end

--- Cancels run `id` (a bang command or a tool call; `:AgentBashCancel {id}`), by default the
--- newest running bang command. Returns false (and says so) when it does not run.
---@param id? integer
---@return boolean
function M.cancel(id)
  local runs = require('agent_bash.runs')
  local run = id and runs.get(id) or (not id and runs.bang()) or nil
  if not run then
    vim.notify(
      id and ('agent-bash: run %d is not running'):format(id) or 'agent-bash: no bash command is running',
      vim.log.levels.INFO
    )
    return false
  end
  runs.cancel(run)
  return true
end

---@class agent_bash.Handle
---@field id integer
---@field cancel fun(self: agent_bash.Handle) cancel the call; safe to call twice or after it ended

--- Runs an agent's tool call (contract §9). `on_done(result)` is called exactly once with the
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

--- The agent's context (contract §10): `{role = 'user', content}` per recorded, non-excluded bang
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
--- that changed files), without asking (contract §13, |agent_bash-undo|). Returns the undo's
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

--- Moves the cursor into run `id`'s terminal or card (`:AgentBashFocus {id}`), showing it again
--- when it was closed or had no room; by default into the running terminal, else the newest
--- card. Returns false (and says so) when there is no such run.
---@param id? integer
---@return boolean
function M.focus(id)
  local float, terminal = require('agent_bash.float'), require('agent_bash.terminal')
  if not id then
    if not terminal.focus() then
      float.focus()
    end
    return true
  end
  local runs = require('agent_bash.runs')
  local run = runs.get(id) or runs.finished(id)
  if not run then
    vim.notify(('agent-bash: no run %d (finished runs: :AgentBashHistory)'):format(id), vim.log.levels.INFO)
    return false
  end
  if run.term and terminal.focus(run.term) then
    return true
  end
  if not run.card or run.card.closed then
    run.card = float.open(run, { enter = false })
  end
  float.focus(run.card)
  return true
end

--- Collapses or expands the newest card.
function M.toggle()
  local cards = require('agent_bash.float').cards()
  if #cards > 0 then
    require('agent_bash.float').toggle(cards[#cards])
  end
end

--- Closes every card (their commands keep running: `:AgentBashFocus {id}` shows them again)
--- and the floats of finished terminals.
function M.close_all()
  local float = require('agent_bash.float')
  for _, card in ipairs(float.cards()) do
    float.close(card, { no_layout = true })
  end
  require('agent_bash.terminal').close_finished()
  float.layout()
end

--- Closes run `id`'s card or terminal float (`:AgentBashClose {id}`; no id: every one). The
--- command keeps running.
---@param id? integer
function M.close(id)
  if not id then
    return M.close_all()
  end
  local run = require('agent_bash.runs').get(id) or require('agent_bash.runs').finished(id)
  local found = false
  if run and run.card and not run.card.closed then
    require('agent_bash.float').close(run.card)
    found = true
  end
  local term = require('agent_bash.terminal').get(id)
  if term and term.win then
    require('agent_bash.terminal').close(term)
    found = true
  end
  if not found then
    vim.notify(('agent-bash: run %d shows nothing to close'):format(id), vim.log.levels.INFO)
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

--- As `:!` does with 'autowrite' or 'autowriteall': modified buffers with a file are written
--- before the command runs, so it sees what the user sees.
function H.autowrite()
  if not (vim.o.autowrite or vim.o.autowriteall) then
    return
  end
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    local bo = vim.bo[buf]
    if vim.api.nvim_buf_is_loaded(buf) and bo.modified and bo.buftype == '' and not bo.readonly
      and vim.api.nvim_buf_get_name(buf) ~= '' then
      local ok, err = pcall(vim.api.nvim_buf_call, buf, function()
        vim.cmd('silent update')
      end)
      if not ok then
        vim.notify('agent-bash: autowrite: ' .. tostring(err), vim.log.levels.WARN)
      end
    end
  end
end

--- `:{range}AgentBash {filter}` as `:{range}!`: the lines go to the command's standard input
--- (a temporary file), and when it succeeds its output replaces them in one change (one undo).
--- A failed or cancelled filter, or a buffer changed meanwhile, leaves the lines alone.
function H.filter(cmd, opts)
  local buf = vim.api.nvim_get_current_buf()
  local first, last = opts.range[1], opts.range[2]
  local input = vim.fn.tempname()
  vim.fn.writefile(vim.api.nvim_buf_get_lines(buf, first - 1, last, false), input)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  local run
  run = require('agent_bash.runs').start({
    origin = 'bang',
    command = cmd,
    -- a group, so that every stage of a pipeline reads from the lines' file
    run_command = ('{ %s\n} < %s'):format(cmd, vim.fn.shellescape(input)),
    cwd = vim.fn.getcwd(),
    local_cwd = true,
    profile = H.profile(),
    exclude = opts.exclude and true or false,
    enter = false,
    on_done = function(result)
      vim.schedule(function()
        os.remove(input)
        H.filtered(run, buf, first, last, tick, result)
      end)
    end,
  })
  return run.id
end

function H.filtered(run, buf, first, last, tick, result)
  if result.error or result.cancelled or result.timed_out or result.exit_code ~= 0 then
    return -- the card says why; the lines stay
  end
  if not vim.api.nvim_buf_is_valid(buf) or vim.api.nvim_buf_get_changedtick(buf) ~= tick then
    vim.notify('agent-bash: the buffer changed while the filter ran: lines left as they were', vim.log.levels.WARN)
    return
  end
  local lines, err = require('agent_bash.float').output_lines(run)
  if not lines or H.partial(run) then
    vim.notify('agent-bash: filter output not available: ' .. tostring(err or 'truncated without an artifact'), vim.log.levels.ERROR)
    return
  end
  vim.api.nvim_buf_set_lines(buf, first - 1, last, false, lines)
  if run.card then
    require('agent_bash.float').close(run.card)
  end
  local n = last - first + 1
  vim.notify(('%d line%s filtered'):format(n, n == 1 and '' or 's'), vim.log.levels.INFO)
end

--- The run holds only part of its output and no artifact has the rest.
function H.partial(run)
  local s = run.state
  if s.full_lines then
    return false
  end
  local r = s.result or {}
  return (s.total_lines or 0) > #(s.lines or {}) and not r.artifact_id
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
