-- :AgentBashHistory: the session's recorded bang commands (contract §9, §10), newest first, with
-- vim.ui.select. A chosen run reopens as a finished card built from its record, or opens its
-- artifact.

local M = {}
local H = {}

--- Runs listed by the picker (the newest ones).
M.limit = 200

--- Lists the session's newest runs; the chosen one reopens as a card or opens its artifact.
function M.pick()
  -- The newest page (the backend never sends the whole session).
  local entries, err = require('agent_bash.context').history({ limit = M.limit })
  if not entries then
    vim.notify('agent-bash: could not read the history: ' .. tostring(err), vim.log.levels.ERROR)
    return
  end
  if #entries == 0 then
    vim.notify('agent-bash: no commands recorded in this session yet', vim.log.levels.INFO)
    return
  end
  local items = {}
  for i = #entries, 1, -1 do
    items[#items + 1] = entries[i]
  end
  vim.ui.select(items, { prompt = 'agent-bash history', kind = 'agent_bash_history', format_item = M.format }, function(entry)
    if entry then
      M.choose(entry)
    end
  end)
end

--- Offers what to do with a run: reopen its card, or open its artifact when it has one.
---@param entry agent_bash.HistoryEntry
function M.choose(entry)
  local id = entry.meta and entry.meta.artifact_id
  if not id then
    M.open_card(entry)
    return
  end
  local actions = { 'Reopen the card', ('Open artifact://%d'):format(id) }
  vim.ui.select(actions, { prompt = '$ ' .. H.first_line(entry.command), kind = 'agent_bash_history_action' }, function(_, idx)
    if idx == 1 then
      M.open_card(entry)
    elseif idx == 2 then
      vim.cmd.edit(('artifact://%d'):format(id))
    end
  end)
end

--- One line per run: `<time> $ <command> · <status> · <duration> · <N lines>[ · artifact://<id>][ · not in context]`.
---@param entry agent_bash.HistoryEntry
---@return string
function M.format(entry)
  local card = require('agent_bash.card')
  local meta = entry.meta or {}
  local parts = { ('%s $ %s'):format(os.date('%H:%M:%S', math.floor((entry.timestamp or 0) / 1000)), H.first_line(entry.command)) }
  parts[#parts + 1] = M.status(entry)
  if meta.duration_ms then
    parts[#parts + 1] = card.format_duration(meta.duration_ms)
  end
  local n = meta.total_lines or 0
  parts[#parts + 1] = n == 1 and '1 line' or ('%d lines'):format(n)
  if meta.artifact_id then
    parts[#parts + 1] = ('artifact://%d'):format(meta.artifact_id)
  end
  if entry.exclude_from_context then
    parts[#parts + 1] = 'not in context'
  end
  return table.concat(parts, ' · ')
end

--- `ok`, `exit <N>`, `cancelled`, `timed out` or `missing exit status`.
---@param entry agent_bash.HistoryEntry
---@return string
function M.status(entry)
  if entry.meta and entry.meta.timed_out then
    return 'timed out'
  elseif entry.cancelled then
    return 'cancelled'
  elseif entry.exit_code == nil then
    return 'missing exit status'
  elseif entry.exit_code ~= 0 then
    return ('exit %d'):format(entry.exit_code)
  end
  return 'ok'
end

--- The card state of a finished run, rebuilt from its record: header, output lines, status,
--- truncation warning (no colours: the record keeps plain text).
---@param entry agent_bash.HistoryEntry
---@return agent_bash.CardState
function M.card_state(entry)
  local meta = entry.meta or {}
  local lines = entry.output ~= '' and require('agent_bash.artifact').split(entry.output) or {}
  local limit, limit_lines = H.notice_limit(meta.notice)
  ---@type agent_bash.BashResult
  local result = {
    output = entry.output,
    exit_code = entry.exit_code,
    cancelled = entry.cancelled,
    timed_out = meta.timed_out or false,
    truncated = entry.truncated,
    total_lines = meta.total_lines or #lines,
    total_bytes = meta.total_bytes or #entry.output,
    output_lines = meta.output_lines or #lines,
    output_bytes = #entry.output,
    artifact_id = meta.artifact_id,
    duration_ms = meta.duration_ms or 0,
    is_error = not entry.cancelled and entry.exit_code ~= 0,
    truncation = (limit or limit_lines)
        and { limit_bytes = limit, limit_lines = limit_lines, truncated_by = limit_lines and 'lines' or 'bytes' }
      or nil,
    resources = type(meta.resources) == 'table' and meta.resources or nil,
    rescued = type(meta.rescued) == 'table' and meta.rescued or nil,
  }
  return {
    origin = 'bang',
    command = entry.command,
    exclude = entry.exclude_from_context,
    status = require('agent_bash.card').status_of(result),
    lines = lines,
    hl = {},
    total_lines = result.total_lines,
    result = result,
  }
end

--- Opens a finished card for a recorded run and moves into it.
---@param entry agent_bash.HistoryEntry
---@return agent_bash.Card
function M.open_card(entry)
  ---@type agent_bash.Run
  local run = { id = 0, finished = true, state = M.card_state(entry) }
  return require('agent_bash.float').open(run, { enter = true })
end

-- Helpers -----------------------------------------------------------------------------------

function H.first_line(cmd)
  local first = cmd:match('^[^\n]*')
  return first == cmd and cmd or first .. ' …'
end

H.units = { B = 1, KB = 1024, MB = 1024 ^ 2, GB = 1024 ^ 3 }

--- The window limit in bytes from a truncation notice's `(<size> limit)`, e.g. 50.0KB → 51200.
---@param notice? string
---@return integer?
function H.notice_limit(notice)
  local lines = (notice or ''):match('%((%d+) lines limit%)')
  if lines then
    return nil, tonumber(lines)
  end
  local value, unit = (notice or ''):match('%(([%d.]+)(%a+) limit%)')
  if not value or not H.units[unit] then
    return nil
  end
  return math.floor(tonumber(value) * H.units[unit] + 0.5)
end

return M
