-- Runs: one per bang command or tool call. Gives ids, sends `run`/`cancel` to the backend,
-- applies the backend's events (update, done, error) to the run's card state, calls the
-- caller's callbacks, and fails running runs when the backend dies.

local M = {}
local H = {}

local log = require('agent_bash.log')

---@class agent_bash.Run
---@field id integer
---@field state agent_bash.CardState
---@field on_update? fun(update: agent_bash.Update)
---@field on_done? fun(result: agent_bash.BashResult)
---@field card? agent_bash.Card
---@field term? agent_bash.Term the terminal float of a PTY run (terminal.lua sets it)
---@field pty? boolean a terminal was asked for (`:AgentBashTerm`)
---@field enter? boolean focus the card when one opens
---@field finished boolean
---@field remote_cancel? fun() a run another process executes (the editor mirror): how to cancel it
---@field remote_chan? integer that process's channel
---@field efm_win? integer window the command was typed in (its 'errorformat' reads the errors)

---@class agent_bash.RunSpec
---@field origin agent_bash.Origin
---@field command string
---@field run_command? string what the shell runs, when it differs from the command shown (a filter's input redirection)
---@field cwd string sent to the backend
---@field local_cwd? boolean `cwd` is the editor's: a run the backend sends to a remote profile starts at `remote_cwd` instead
---@field remote_cwd? string the caller's own cwd, for a run that goes to a remote profile
---@field cwd_label? string shown in the header
---@field timeout? number
---@field head? integer
---@field tail? integer
---@field tools? string[]
---@field session_key? string
---@field profile? string a remote profile of the backend's settings (contract §12)
---@field exclude? boolean
---@field on_update? fun(update: agent_bash.Update)
---@field on_done? fun(result: agent_bash.BashResult)
---@field card? boolean open a card (default true; a PTY run waits for its terminal instead)
---@field enter? boolean focus the card
---@field pty? boolean ask for a PTY (`:AgentBashTerm`)
---@field ui? boolean tool calls: an interactive UI is attached (the backend may then use a PTY)

--- Starts a run: opens its card, then sends `run` to the backend (starting it if needed).
---@param spec agent_bash.RunSpec
---@return agent_bash.Run
function M.start(spec)
  H.next_id = H.next_id + 1
  ---@type agent_bash.Run
  local run = {
    id = H.next_id,
    finished = false,
    on_update = spec.on_update,
    on_done = spec.on_done,
    pty = spec.pty,
    enter = spec.enter,
    state = {
      origin = spec.origin,
      command = spec.command,
      cwd_label = spec.cwd_label,
      timeout = spec.timeout,
      exclude = spec.exclude,
      profile = spec.profile,
      -- where the command started on this machine (quickfix reads relative paths against it)
      cwd = spec.local_cwd and not spec.profile and spec.cwd or nil,
      status = 'running',
      lines = {},
      hl = {},
      total_lines = 0,
      started_at = vim.uv.now(),
    },
    efm_win = vim.api.nvim_get_current_win(),
  }
  H.runs[run.id] = run
  H.ticker()
  require('agent_bash.guard').update(M.running())
  if spec.card ~= false and not spec.pty then
    run.card = require('agent_bash.float').open(run, { enter = spec.enter })
  end
  local ok, err = require('agent_bash.backend').notify('run', {
    id = run.id,
    origin = spec.origin,
    command = spec.run_command or spec.command,
    cwd = spec.cwd,
    local_cwd = spec.local_cwd,
    remote_cwd = spec.remote_cwd,
    timeout = spec.timeout,
    head = spec.head,
    tail = spec.tail,
    tools = spec.tools,
    session_key = spec.session_key,
    profile = spec.profile,
    exclude_from_context = spec.exclude or false,
    pty = spec.pty,
    ui = spec.ui,
  })
  if not ok then
    vim.notify('agent-bash: ' .. tostring(err), vim.log.levels.ERROR)
    M.fail(run, err)
  end
  return run
end

--- Shows a run that another process executes (an MCP server mirrored into this editor, contract
--- §11): its card, fed by the same events as a backend run, but no `run` is sent to the
--- backend; cancelling it calls `cancel`.
---@param spec agent_bash.RunSpec|{client?: string}
---@param cancel fun()
---@return agent_bash.Run
function M.attach(spec, cancel)
  H.next_id = H.next_id + 1
  ---@type agent_bash.Run
  local run = {
    id = H.next_id,
    finished = false,
    remote_cancel = cancel,
    state = {
      origin = spec.origin,
      command = spec.command,
      cwd_label = spec.cwd_label,
      timeout = spec.timeout,
      client = spec.client,
      status = 'running',
      lines = {},
      hl = {},
      total_lines = 0,
      started_at = vim.uv.now(),
    },
  }
  H.runs[run.id] = run
  H.ticker() -- its title ticks like any card's
  if spec.card ~= false then
    run.card = require('agent_bash.float').open(run, { enter = false })
  end
  return run
end

--- Fails the unfinished runs of a mirrored process that went away.
---@param chan integer
---@param message string
function M.fail_remote(chan, message)
  for _, run in pairs(H.runs) do
    if run.remote_chan == chan then
      M.fail(run, message)
    end
  end
end

--- Asks the backend to cancel a run. Safe to call twice and after the run ended.
---@param run agent_bash.Run
function M.cancel(run)
  if run.finished or run.state.cancel_requested then
    return
  end
  run.state.cancel_requested = true
  if run.remote_cancel then
    run.remote_cancel()
    H.refresh(run)
    return
  end
  local ok, err = require('agent_bash.backend').notify('cancel', { id = run.id })
  if not ok then
    M.fail(run, err)
    return
  end
  H.refresh(run)
end

--- The unfinished run with this id, if any.
---@param id integer
---@return agent_bash.Run?
function M.get(id)
  return H.runs[id]
end

--- The newest running bang command, if any.
---@return agent_bash.Run?
function M.bang()
  local best
  for id, run in pairs(H.runs) do
    if run.state.origin == 'bang' and (not best or id > best.id) then
      best = run
    end
  end
  return best
end

--- Unfinished runs, oldest first.
---@return agent_bash.Run[]
function M.running()
  local list = vim.tbl_values(H.runs)
  table.sort(list, function(a, b)
    return a.id < b.id
  end)
  return list
end

--- Finished runs kept for `:AgentBashQuickfix` (the newest few), by id.
---@param id? integer nil: the newest finished run
---@return agent_bash.Run?
function M.finished(id)
  if id then
    return H.done[id]
  end
  local best
  for i, run in pairs(H.done) do
    if not best or i > best.id then
      best = run
    end
  end
  return best
end

--- The newest unfinished run, if any.
---@return agent_bash.Run?
function M.latest()
  local best
  for id, run in pairs(H.runs) do
    if not best or id > best.id then
      best = run
    end
  end
  return best
end

--- Applies one backend event.
---@param ev table
function M.on_event(ev)
  ev = require('agent_bash.backend').denil(ev)
  local run = H.runs[ev.id]
  if not run or run.finished then
    log.debug('event %s for unknown or finished run %s', tostring(ev.type), tostring(ev.id))
    return
  end
  local s = run.state
  if ev.type == 'update' then
    s.lines, s.hl = ev.lines or {}, ev.hl or {}
    s.total_lines, s.elapsed_ms = ev.total_lines or #s.lines, ev.elapsed_ms
    H.ensure_view(run)
    H.refresh(run)
    H.call(run, 'on_update', ev)
  elseif ev.type == 'done' then
    local result = ev.result or {}
    s.lines, s.hl = ev.lines or s.lines, ev.hl or {}
    s.total_lines = result.total_lines or #s.lines
    s.result = result
    s.status = require('agent_bash.card').status_of(result)
    H.finish(run, result)
    if s.origin == 'bang' then
      require('agent_bash.context')._on_bang_done(run)
    end
  elseif ev.type == 'waiting' then
    -- A PTY run's program waits for input (the backend watched its terminal read).
    local waiting = ev.waiting and true or false
    if s.waiting_input ~= waiting then
      s.waiting_input = waiting
      H.refresh(run)
      if waiting then
        H.on_waiting(run)
      end
    end
  elseif ev.type == 'error' then
    -- The backend's own words (contract §3 texts such as `Working directory does not exist: …`)
    -- reach the agent exactly; the card still says `Bash command failed: …`.
    M.fail(run, ev.message or 'unknown error', true)
  else
    log.warn('unknown event type %s', tostring(ev.type))
  end
end

--- Ends a run that could not start or lost its backend: the card shows
--- `Bash command failed: <message>`, a tool call gets an error result.
---@param run agent_bash.Run
---@param message string
---@param exact? boolean the message is the backend's exact text: the result's output is it alone
function M.fail(run, message, exact)
  if run.finished then
    return
  end
  run.state.error = message
  run.state.status = 'failed'
  H.finish(run, M.error_result(message, exact))
end

--- The result a tool call gets when it could not run.
---@param message string
---@param exact? boolean
---@return agent_bash.BashResult
function M.error_result(message, exact)
  return {
    output = exact and message or ('Bash command failed: ' .. message),
    error = message,
    is_error = true,
    cancelled = false,
    timed_out = false,
    truncated = false,
    total_lines = 0,
    total_bytes = 0,
    output_lines = 0,
    output_bytes = 0,
    duration_ms = 0,
  }
end

--- Fails every running run (the backend exited).
---@param code integer
function M.on_backend_exit(code)
  log.warn('backend exited with code %d; failing %d running runs', code, vim.tbl_count(H.runs))
  for _, run in pairs(H.runs) do
    if not run.remote_cancel then
      M.fail(run, 'backend exited')
    end
  end
end

--- Completion for the commands that take a run id: the ids of running runs and of runs on
--- screen, each with its command (`12 make test`); only the id is read back.
---@param lead string
---@return string[]
function M.complete(lead)
  local runs, items = M, {}
  local seen = {}
  local function add(run)
    if seen[run.id] then
      return
    end
    seen[run.id] = true
    local item = ('%d %s'):format(run.id, (run.state.command:match('^[^\n]*') or ''))
    if lead == '' or item:find(lead, 1, true) == 1 or item:find(lead, 1, true) then
      items[#items + 1] = item
    end
  end
  local list = runs.running()
  for i = #list, 1, -1 do
    add(list[i])
  end
  local cards = require('agent_bash.float').cards()
  for i = #cards, 1, -1 do
    add(cards[i].run)
  end
  for _, term in pairs(require('agent_bash.terminal').terms()) do
    if term.run and term.win then
      add(term.run)
    end
  end
  return items
end

--- The run id at the start of a command's argument (`12` or `12 make test`), nil when none.
---@param args string
---@return integer?
function M.run_id(args)
  return tonumber(args:match('^%s*(%d+)'))
end

-- Helpers -----------------------------------------------------------------------------------

H.runs = {} ---@type table<integer, agent_bash.Run>
H.done = {} ---@type table<integer, agent_bash.Run>
H.next_id = 0
H.KEEP_DONE = 20

function H.finish(run, result)
  local hidden = not H.shown(run)
  run.finished = true
  run.state.waiting_input = nil
  H.runs[run.id] = nil
  H.done[run.id] = run
  H.done[run.id - H.KEEP_DONE] = nil
  require('agent_bash.guard').update(M.running())
  require('agent_bash.backend')._on_run_end()
  H.ensure_view(run)
  H.refresh(run)
  if run.term then
    require('agent_bash.terminal').finish(run.term)
  end
  H.call(run, 'on_done', result)
  if hidden and run.state.origin == 'bang' then
    H.notify_end(run)
  end
  require('agent_bash.quickfix').on_done(run)
  if result.changes_indexing then
    -- No receipt: the project's first snapshot goes on; the card follows it.
    require('agent_bash.changes').follow(run)
  end
  H.check_files(result)
  if run.state.origin == 'bang' and run.card then
    -- at most one finished bang card on screen: this one
    require('agent_bash.float').close_finished({ bang = true, except = run.card })
  end
  H.auto_close(run)
end

--- A finished tool-call card closes by itself after `card.auto_close` ms, unless the cursor
--- is in it or it is expanded (then it is looked at again after the same delay).
function H.auto_close(run)
  local ms = require('agent_bash.config').options.card.auto_close
  if not ms or run.state.origin ~= 'tool' or not run.card then
    return
  end
  vim.defer_fn(function()
    local card = run.card
    local float = require('agent_bash.float')
    if not card or card.closed then
      return
    end
    if card.expanded or float.focused(card) then
      H.auto_close(run)
      return
    end
    float.close(card)
  end, ms)
end

--- Like `:!`, a finished command has Neovim check the files its buffers show (`:checktime`):
--- an unmodified buffer whose file the command changed is reloaded ('autoread'), a modified
--- one warns (W12). Bang commands and tool calls alike; not a run that never started.
---@param result agent_bash.BashResult
function H.check_files(result)
  if result.error then
    return
  end
  vim.schedule(function()
    pcall(vim.cmd.checktime)
  end)
end

function H.refresh(run)
  if run.card then
    require('agent_bash.float').refresh(run.card)
  end
  if run.term and not run.finished then
    require('agent_bash.terminal').refresh(run.term)
  end
end

--- A PTY run that gets output or ends without a terminal (the backend used pipes, or failed
--- before opening one) shows a card instead, so nothing happens unseen.
function H.ensure_view(run)
  if run.pty and not run.term and not run.card then
    run.card = require('agent_bash.float').open(run, { enter = run.enter })
  end
end

--- Whether the run's card or terminal float is on screen.
function H.shown(run)
  if require('agent_bash.float').visible(run.card) then
    return true
  end
  return run.term ~= nil and run.term.win ~= nil and vim.api.nvim_win_is_valid(run.term.win)
end

--- A bang command ended while nothing showed it: say so.
function H.notify_end(run)
  local s = run.state
  local words = require('agent_bash.card').status_words(s)
  local level = s.status == 'done' and vim.log.levels.INFO or vim.log.levels.WARN
  log.say('agent-bash: %s · ' .. table.concat(words, ' · '), '$ ' .. s.command, level)
end

--- A run's program waits for input: mark it, and for a tool call (nobody is watching it type)
--- say so, with the way to take over.
function H.on_waiting(run)
  if run.term then
    require('agent_bash.terminal').refresh(run.term)
  end
  if run.state.origin == 'tool' then
    log.say('agent-bash: waiting for input: %s (:AgentBashFocus)', '$ ' .. run.state.command, vim.log.levels.WARN)
  end
end

--- One timer for every running card: titles tick once a second while something runs.
function H.ticker()
  if H.timer then
    return
  end
  H.timer = assert(vim.uv.new_timer())
  H.timer:start(
    1000,
    1000,
    vim.schedule_wrap(function()
      if next(H.runs) == nil then
        if H.timer then
          H.timer:stop()
          H.timer:close()
          H.timer = nil
        end
        return
      end
      require('agent_bash.float').tick()
      for _, run in pairs(H.runs) do
        if run.term then
          require('agent_bash.terminal').refresh(run.term)
        end
      end
    end)
  )
end

--- Calls a caller's callback; its errors are reported, never raised into event handling.
function H.call(run, name, arg)
  local fn = run[name]
  if not fn then
    return
  end
  local ok, err = xpcall(fn, debug.traceback, arg)
  if not ok then
    log.error('%s of run %d failed: %s', name, run.id, err)
    vim.notify(('agent-bash: %s callback failed: %s'):format(name, err), vim.log.levels.ERROR)
  end
end

return M
