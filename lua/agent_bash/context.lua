-- Session recording and context (SPEC §10), the agent plugin's side. The backend records every
-- bang command in the session's JSONL file and words the user messages (one source of truth);
-- this module asks it for them and hands new ones to the agent plugin: at once when the agent
-- is idle, queued while it is busy (streaming) until it takes them before its next prompt.

local M = {}
local H = {}

local log = require('agent_bash.log')

--- The agent's context: one user message per recorded, non-excluded bang command of the
--- session, oldest first. Returns nil and the error when the backend cannot answer.
---@return agent_bash.ContextMessage[]? messages
---@return string? err
function M.context()
  return H.request('get_context')
end

--- Every recorded bang command of the session (excluded ones too), oldest first. Returns nil
--- and the error when the backend cannot answer.
---@return agent_bash.HistoryEntry[]? entries
---@return string? err
function M.history()
  return H.request('history')
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
    return -- recorded, but never sent (SPEC §10)
  end
  local messages, err = M.context()
  if not messages then
    log.warn('could not read the context after run %d: %s', run.id, tostring(err))
    return
  end
  local fresh = vim.list_slice(messages, math.min(H.seen, #messages) + 1)
  H.seen = #messages
  vim.list_extend(H.pending, fresh)
  H.deliver()
end

-- Helpers -----------------------------------------------------------------------------------

H.busy = false
H.hook = nil ---@type fun(msg: agent_bash.ContextMessage)?
H.pending = {} ---@type agent_bash.ContextMessage[]
H.seen = 0 -- context messages already taken from the backend

function H.request(method)
  local ok, res = require('agent_bash.backend').request(method, {})
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
