-- What a command did to the files (contract §13): `:AgentBashUndo [id]` and `:AgentBashDiff [id]`.
-- Ids are the `changes_id` of a result (shown on the card of a run that changed files); no id
-- means the newest run that changed files. The backend keeps the files' earlier states in a
-- shadow git store of its own; this module only asks for them.

local M = {}
local H = {}

local backend = require('agent_bash.backend')

M.LETTER = { added = 'A', modified = 'M', deleted = 'D', mode = 'X' }

---@class agent_bash.Change
---@field path string relative to the project root
---@field kind 'added'|'modified'|'deleted'|'mode'

---@class agent_bash.ChangeRecord
---@field id integer
---@field root string
---@field command string
---@field changes agent_bash.Change[]

--- A run's changes (every changed path). Returns the record, or nil and an error message.
---@param id? integer nil: the newest run that changed files
---@return agent_bash.ChangeRecord? record
---@return string? err
function M.get(id)
  local ok, res = backend.request('changes', { id = id })
  if not ok then
    return nil, res
  end
  return backend.denil(res)
end

--- Undoes run `id` without asking (the Lua API). Returns the undo's result (`undone`,
--- `output`, `changes_id` of the undo itself, `changes`), or nil and the refusal or error text
--- (a refusal names the files changed since the run).
---@param id? integer nil: the newest run that changed files
---@return table? result
---@return string? err
function M.undo(id)
  local ok, res = backend.request('undo', { id = id })
  if not ok then
    return nil, res
  end
  res = backend.denil(res)
  -- Buffers showing restored files are reloaded (unmodified ones; 'autoread' rules).
  pcall(vim.cmd.checktime)
  return res
end

--- One line per change: `M src/a.rs`.
---@param c agent_bash.Change
---@return string
function M.format(c)
  return ('%s %s'):format(M.LETTER[c.kind] or '?', c.path)
end

--- `:AgentBashUndo [id]`: lists the files and asks before putting them back; an undo that
--- would be refused (files changed since the run) is refused before asking.
---@param arg string
function M.undo_command(arg)
  local rec, err = H.record(arg)
  if not rec then
    return vim.notify('agent-bash: ' .. err, vim.log.levels.ERROR)
  end
  local ok, refusal = backend.request('undo_check', { id = rec.id })
  if not ok then
    return vim.notify('agent-bash: ' .. tostring(refusal), vim.log.levels.ERROR)
  end
  local lines = {}
  for i, c in ipairs(rec.changes) do
    if i > M.CONFIRM_LINES then
      lines[#lines + 1] = ('… and %d more'):format(#rec.changes - M.CONFIRM_LINES)
      break
    end
    lines[#lines + 1] = '  ' .. M.format(c)
  end
  local msg = ('Undo run %d ($ %s) in %s?\nThese files go back to how they were before it:\n%s'):format(
    rec.id,
    H.first_line(rec.command),
    rec.root,
    table.concat(lines, '\n')
  )
  if vim.fn.confirm(msg, '&Undo\n&Cancel', 2) ~= 1 then
    return
  end
  local res
  res, err = M.undo(rec.id)
  if not res then
    return vim.notify('agent-bash: ' .. err, vim.log.levels.ERROR)
  end
  local tail = res.changes_id and (' (:AgentBashUndo %d to redo)'):format(res.changes_id) or ''
  vim.notify('agent-bash: ' .. res.output .. tail, vim.log.levels.INFO)
end

--- Files shown in the confirmation before `… and N more`.
M.CONFIRM_LINES = 30

--- `:AgentBashDiff [id]`: the run's changed files in a list; the chosen one opens a diff (a
--- run that changed one file opens it at once).
---@param arg string
function M.diff_command(arg)
  local rec, err = H.record(arg)
  if not rec then
    return vim.notify('agent-bash: ' .. err, vim.log.levels.ERROR)
  end
  if #rec.changes == 1 then
    local ok, e = M.open_diff(rec, rec.changes[1])
    if not ok then
      vim.notify('agent-bash: ' .. e, vim.log.levels.ERROR)
    end
    return
  end
  vim.ui.select(rec.changes, {
    prompt = ('Files changed by run %d ($ %s)'):format(rec.id, H.first_line(rec.command)),
    kind = 'agent_bash_changes',
    format_item = M.format,
  }, function(c)
    if c then
      local ok, e = M.open_diff(rec, c)
      if not ok then
        vim.notify('agent-bash: ' .. e, vim.log.levels.ERROR)
      end
    end
  end)
end

--- Opens a tab with the file as it is now and, beside it, a scratch buffer with its content
--- before the run, both in diff mode. A file the run deleted shows as an empty scratch buffer;
--- one it added, against an empty one.
---@param rec agent_bash.ChangeRecord
---@param change agent_bash.Change
---@return boolean ok
---@return string? err
function M.open_diff(rec, change)
  local ok, res = backend.request('changes_before', { id = rec.id, path = change.path })
  if not ok then
    return false, res
  end
  res = backend.denil(res)
  local path = rec.root .. '/' .. change.path
  vim.cmd.tabnew()
  if vim.uv.fs_stat(path) then
    vim.cmd.edit(vim.fn.fnameescape(path))
  else
    H.scratch(('agentbash://now/%d/%s'):format(rec.id, change.path), {}, '(deleted)')
  end
  local now_win = vim.api.nvim_get_current_win()
  vim.cmd('leftabove vnew')
  local before = res.exists and vim.split(res.content or '', '\n', { plain = true }) or {}
  if res.exists and before[#before] == '' then
    before[#before] = nil -- the file's final newline
  end
  H.scratch(('agentbash://before/%d/%s'):format(rec.id, change.path), before, res.exists and nil or '(did not exist)')
  local ft = vim.filetype.match({ filename = path })
  if ft then
    vim.bo.filetype = ft
  end
  vim.cmd.diffthis()
  vim.api.nvim_set_current_win(now_win)
  vim.cmd.diffthis()
  return true
end

--- How often the card of a run that had no receipt because its project's first snapshot was
--- being taken asks how far the snapshot has got: as often as running cards' titles tick.
M.FOLLOW_MS = 1000

---@class agent_bash.ProjectStatus
---@field root string
---@field engine? integer pid of the shared receipt engine (nil: the backend's own snapshots)
---@field state 'waiting'|'indexing'|'ready'|'off'|'busy'
---@field hashed? integer indexing: files hashed so far
---@field total? integer indexing: of how many (nil: not counted)
---@field files? integer ready: files in the latest snapshot
---@field reason? string off: why
---@field note string the same in words

--- Whether the receipts of each project the running backend knows (or of `roots`) are ready
--- (nil when no backend runs: this never starts one, or when it did not answer).
---@param roots? string[]
---@return agent_bash.ProjectStatus[]?
function M.status(roots)
  if not backend.info().chan then
    return nil
  end
  local ok, res = backend.request('changes_status', { roots = roots })
  if not ok or type(res) ~= 'table' then
    return nil
  end
  return backend.denil(res)
end

--- Follows the first snapshot that kept `run` from a receipt (`result.changes_indexing`, its
--- project's root): once a second the card's note says how far it has got, until receipts are
--- ready or off (the last word), the card closes or the backend goes. One request a second
--- serves every such card, and a card is redrawn only when its note changed.
---@param run agent_bash.Run
function M.follow(run)
  H.followed[run] = true
  if H.timer then
    return
  end
  H.timer = assert(vim.uv.new_timer())
  H.timer:start(M.FOLLOW_MS, M.FOLLOW_MS, vim.schedule_wrap(H.poll))
end

-- Helpers -----------------------------------------------------------------------------------

H.followed = {} ---@type table<agent_bash.Run, true>

function H.poll()
  local roots = {}
  for run in pairs(H.followed) do
    roots[#roots + 1] = run.state.result.changes_indexing
  end
  local list = M.status(roots)
  local by_root = {}
  for _, p in ipairs(list or {}) do
    by_root[p.root] = p
  end
  for run in pairs(H.followed) do
    local p = by_root[run.state.result.changes_indexing]
    if not list or not p or not run.card or run.card.closed then
      H.followed[run] = nil
    else
      if not vim.deep_equal(run.state.receipts, p) then
        run.state.receipts = p
        require('agent_bash.float').refresh(run.card)
      end
      if p.state ~= 'indexing' and p.state ~= 'busy' then
        H.followed[run] = nil
      end
    end
  end
  if next(H.followed) == nil and H.timer then
    H.timer:stop()
    H.timer:close()
    H.timer = nil
  end
end

--- Fills the current window with a read-only scratch buffer named `name`.
function H.scratch(name, lines, note)
  local buf = vim.api.nvim_get_current_buf()
  vim.bo[buf].buftype = 'nofile'
  vim.bo[buf].bufhidden = 'wipe'
  vim.bo[buf].swapfile = false
  local existing = vim.fn.bufnr(name)
  if existing ~= -1 and existing ~= buf then
    pcall(vim.api.nvim_buf_delete, existing, { force = true })
  end
  pcall(vim.api.nvim_buf_set_name, buf, name)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = false
  if note then
    vim.b[buf].agent_bash_note = note
  end
  return buf
end

--- The run a command's argument names (the newest with changes when empty), or an error.
---@param arg string
function H.record(arg)
  local id, err = H.parse_id(arg)
  if err then
    return nil, err
  end
  return M.get(id)
end

function H.parse_id(arg)
  if arg == nil or arg == '' then
    return nil
  end
  local id = tonumber(arg)
  if not id or id < 1 or id ~= math.floor(id) then
    return nil, ('expected a changes id (a positive number), got %q'):format(arg)
  end
  return id
end

function H.first_line(s)
  return (s or ''):match('^[^\n]*')
end

return M
