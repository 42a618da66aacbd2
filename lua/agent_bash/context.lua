-- Session recording and context (contract §10), the agent plugin's side. The backend records every
-- bang command in the session's JSONL file and words the user messages (one source of truth);
-- this module asks it for them and hands new ones to the agent plugin: at once when the agent
-- is idle, queued while it is busy (streaming) until it takes them before its next prompt.

local M = {}
local H = {}

local log = require('agent_bash.log')

--- The agent's context: one user message per recorded, non-excluded bang command of the
--- session, oldest first, one page at a time (the backend never sends the whole session):
--- at most `limit` messages (default 50, at most 200) from index `offset` (0-based), or the
--- last `limit` when `offset` is omitted. Returns the messages, nil and the total number of
--- context messages; or nil and the error when the backend cannot answer.
---@param opts? {offset?: integer, limit?: integer}
---@return agent_bash.ContextMessage[]? messages
---@return string? err
---@return integer? total
function M.context(opts)
  local page, err = H.page('get_context', opts)
  if not page then
    return nil, err
  end
  return page.messages or {}, nil, page.total
end

--- The session's recorded bang commands (excluded ones too), oldest first, paged like
--- context(): at most `limit` entries from `offset`, or the last `limit`. Returns the
--- entries, nil and the total; or nil and the error.
---@param opts? {offset?: integer, limit?: integer}
---@return agent_bash.HistoryEntry[]? entries
---@return string? err
---@return integer? total
function M.history(opts)
  local page, err = H.page('history', opts)
  if not page then
    return nil, err
  end
  return page.runs or {}, nil, page.total
end

--- Tells whether the agent is busy (streaming). While busy, new messages are queued.
---@param busy boolean
function M.set_agent_busy(busy)
  require('agent_bash.config').validate('busy', busy, 'boolean')
  H.busy = busy
end

--- Registers the agent plugin's hook (nil removes it). It is called with each new message
--- when a non-excluded bang command finishes while the agent is idle.
---@param fn? fun(msg: agent_bash.ContextMessage)
function M.on_context(fn)
  require('agent_bash.config').validate('fn', fn, 'callable', true)
  H.hook = fn
end

--- The queued messages, oldest first; the queue is emptied.
---@return agent_bash.ContextMessage[]
function M.take_pending()
  local pending = H.pending
  H.pending = {}
  return pending
end

--- Called by runs.lua when a bang command finished (a `done` event: the backend recorded it).
---@param run agent_bash.Run
function M._on_bang_done(run)
  if run.state.exclude then
    return -- recorded, but never sent (contract §10)
  end
  -- Only the messages after the cursor travel (contract §4.3), a page at a time.
  repeat
    local messages, err, total = M.context({ offset = H.seen, limit = 200 })
    if not messages then
      log.warn('could not read the context after run %d: %s', run.id, tostring(err))
      return
    end
    H.seen = H.seen + #messages
    vim.list_extend(H.pending, messages)
  until #messages == 0 or H.seen >= (total or 0)
  H.deliver()
end

-- Helpers -----------------------------------------------------------------------------------

H.busy = false
H.hook = nil ---@type fun(msg: agent_bash.ContextMessage)?
H.pending = {} ---@type agent_bash.ContextMessage[]
H.seen = 0 -- context messages already taken from the backend (the paging cursor)

function H.page(method, opts)
  opts = opts or {}
  require('agent_bash.config').validate('opts.offset', opts.offset, 'number', true)
  require('agent_bash.config').validate('opts.limit', opts.limit, 'number', true)
  local ok, res = require('agent_bash.backend').request(method, { offset = opts.offset, limit = opts.limit })
  if not ok then
    return nil, res
  end
  if type(res) ~= 'table' then
    return nil, ('unexpected answer to %s: %s'):format(method, vim.inspect(res))
  end
  return require('agent_bash.backend').denil(res)
end

--- When idle and hooked, hands every queued message to the hook, oldest first (so messages
--- queued while busy never arrive after newer ones).
function H.deliver()
  if H.busy or not H.hook then
    return
  end
  for _, msg in ipairs(M.take_pending()) do
    local ok, err = xpcall(H.hook, debug.traceback, msg)
    if not ok then
      log.error('on_context hook failed: %s', err)
      vim.notify('agent-bash: on_context hook failed: ' .. tostring(err), vim.log.levels.ERROR)
    end
  end
end

return M
