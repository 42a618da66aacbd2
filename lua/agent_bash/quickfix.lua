-- Errors → quickfix (contract §8.4): a finished run's full output (the artifact when the card holds
-- only part of it) goes through Neovim's own 'errorformat' machinery (`setqflist` with `lines`
-- and `efm`). The format: the `:compiler` mapped to the command's program
-- (`quickfix.compilers`), else the 'errorformat' of the window the command was typed in, which
-- is the user's `:compiler` when they chose one.

local M = {}
local H = {}

--- Fills the quickfix list from run `id` (default: the newest finished run). With `opts.auto`
--- (a run just failed) nothing changes unless errors were recognized. Returns the number of
--- recognized entries (and, third, their summary: `1 error, 2 warnings`), or nil and a message.
---@param id? integer
---@param opts? {auto?: boolean}
---@return integer? count
---@return string? err
---@return string? summary
function M.fill(id, opts)
  opts = opts or {}
  local runs = require('agent_bash.runs')
  local run = runs.finished(id)
  if not run then
    if id and runs.get(id) then
      return nil, ('run %d is still running'):format(id)
    end
    return nil, id and ('no finished run %d'):format(id) or 'no finished run yet'
  end
  local lines, err = require('agent_bash.float').output_lines(run)
  if not lines then
    return nil, err
  end
  local efm = M.errorformat(run.state.command, run.efm_win)
  -- Entries are read against the directory the errors came from: a leading `cd DIR &&` or
  -- `make -C DIR` says it (a directory line the format reads first, as make's "Entering
  -- directory" lines do; those later in the output still apply).
  local dir = run.state.cwd and M.directory(run.state.command, run.state.cwd)
  if dir then
    lines = vim.list_extend({ H.DIR_MARK .. dir }, lines)
    efm = '%D' .. H.DIR_MARK .. '%f,' .. efm
  end
  local parsed = vim.fn.getqflist({ lines = lines, efm = efm })
  local items = parsed.items or {}
  if dir and items[1] and items[1].valid == 0 and items[1].text == H.DIR_MARK .. dir then
    table.remove(items, 1) -- our directory line is not an entry
  end
  local count, summary = M.summary(items)
  if opts.auto and count == 0 then
    return 0, nil, summary
  end
  local title = ('agent-bash: $ %s'):format(run.state.command:match('^[^\n]*'))
  vim.fn.setqflist({}, ' ', { items = items, title = title })
  return count, nil, summary
end

--- The recognized entries of a quickfix list counted by kind (pure): their number and
--- `2 errors, 1 warning, 1 note` (an entry the format gives no type is what its text starts
--- with, `note:` or `warning:`, else an error; zero kinds are left out; `no errors` when none).
---@param items table[] quickfix items (`valid`, `type`)
---@return integer count
---@return string summary
function M.summary(items)
  local n = { error = 0, warning = 0, note = 0 }
  local count = 0
  for _, item in ipairs(items) do
    if item.valid == 1 then
      count = count + 1
      local t = (item.type or ''):lower()
      if t == '' then
        -- Formats that leave the type out keep the compiler's word (gcc's `note: …`).
        local word = (item.text or ''):match('^%s*(%a+):')
        t = ({ note = 'n', help = 'n', info = 'i', warning = 'w', error = 'e' })[word and word:lower() or ''] or ''
      end
      local kind = (t == 'w' and 'warning') or ((t == 'n' or t == 'i') and 'note') or 'error'
      n[kind] = n[kind] + 1
    end
  end
  local parts = {}
  for _, kind in ipairs({ 'error', 'warning', 'note' }) do
    if n[kind] > 0 then
      parts[#parts + 1] = ('%d %s%s'):format(n[kind], kind, n[kind] == 1 and '' or 's')
    end
  end
  return count, #parts > 0 and table.concat(parts, ', ') or 'no errors'
end

--- `:AgentBashQuickfix [id]`.
---@param arg string
function M.command(arg)
  local id
  if arg ~= '' then
    id = tonumber(arg)
    if not id or id ~= math.floor(id) then
      vim.notify(('agent-bash: expected a run id (a number), got %q'):format(arg), vim.log.levels.ERROR)
      return
    end
  end
  local count, err, summary = M.fill(id)
  if not count then
    vim.notify('agent-bash: ' .. err, vim.log.levels.ERROR)
    return
  end
  vim.notify(('agent-bash: %s in the quickfix list'):format(summary), vim.log.levels.INFO)
end

--- Called when a run ends: fills the list automatically after a non-zero exit (option
--- `quickfix.auto`), when its output has errors the format recognizes.
---@param run agent_bash.Run
function M.on_done(run)
  local r = run.state.result
  if not require('agent_bash.config').options.quickfix.auto or not r or r.blocked then
    return
  end
  if r.cancelled or r.exit_code == nil or r.exit_code == 0 then
    return
  end
  local ok, count, _, summary = pcall(M.fill, run.id, { auto = true })
  if ok and count and count > 0 then
    require('agent_bash.log').say(
      ('agent-bash: %s in quickfix (:copen): %%s'):format(summary),
      '$ ' .. run.state.command,
      vim.log.levels.INFO
    )
  elseif not ok then
    require('agent_bash.log').warn('quickfix for run %d: %s', run.id, tostring(count))
  end
end

--- The 'errorformat' for a command's output.
---@param command string
---@param win? integer window the command was typed in
---@return string
function M.errorformat(command, win)
  local prog = M.program(command)
  local name = prog and require('agent_bash.config').options.quickfix.compilers[prog]
  if name then
    local efm = H.compiler_efm(name)
    if efm then
      return efm
    end
  end
  if win and vim.api.nvim_win_is_valid(win) then
    local buf = vim.api.nvim_win_get_buf(win)
    local own = vim.api.nvim_get_option_value('errorformat', { scope = 'local', buf = buf })
    if own ~= '' then
      return own
    end
  end
  return vim.api.nvim_get_option_value('errorformat', { scope = 'global' })
end

--- The directory a command's errors are relative to, when it is not where the command started
--- (`cwd`): after leading `cd DIR &&` steps, and for `make -C DIR` / `make --directory=DIR`.
--- Nil when the command stays in `cwd`.
---@param command string
---@param cwd string
---@return string?
function M.directory(command, cwd)
  local dir, rest = cwd, command
  local moved = false
  while true do
    local d, r = H.cd_step(rest)
    if not d then
      break
    end
    dir, rest, moved = H.join(dir, d), r, true
  end
  local words = vim.split(vim.trim(rest:match('^[^\n|;&]*') or ''), '%s+')
  if M.program(rest) == 'make' then
    for i, w in ipairs(words) do
      local d = (w == '-C' and words[i + 1]) or w:match('^%-C(.+)$') or w:match('^%-%-directory=(.+)$')
      if d then
        dir, moved = H.join(dir, H.unquote(d)), true
        break
      end
    end
  end
  return moved and dir or nil
end

--- The program a command runs: its first word after leading `cd DIR &&` steps, `VAR=value`
--- assignments and common wrappers (`env`, `time`, `npx`, `python -m`), without its directory.
---@param command string
---@return string?
function M.program(command)
  while true do
    local d, rest = H.cd_step(command)
    if not d then
      break
    end
    command = rest
  end
  local words = vim.split(vim.trim(command:match('^[^\n|;&]*') or ''), '%s+')
  local i = 1
  while words[i] do
    local w = words[i]
    if w:match('^[%w_]+=') or H.wrappers[w] or w:match('^%-') then
      i = i + 1
    elseif (w == 'python' or w == 'python3') and words[i + 1] == '-m' then
      i = i + 2
    else
      return (w:match('[^/]+$'))
    end
  end
end

-- Helpers -----------------------------------------------------------------------------------

H.wrappers = { env = true, time = true, nice = true, npx = true, pnpm = true, yarn = true, exec = true, command = true }
H.cache = {} ---@type table<string, string|false>
H.DIR_MARK = 'agent-bash: errors of directory ' -- a line we add for the 'errorformat' %D item

--- A leading `cd DIR &&` step: DIR (unquoted) and the rest of the command.
---@return string? dir
---@return string? rest
function H.cd_step(command)
  local d, rest = command:match('^%s*cd%s+(%b\'\')%s*&&(.*)$')
  if not d then
    d, rest = command:match('^%s*cd%s+(%b"")%s*&&(.*)$')
  end
  if not d then
    d, rest = command:match('^%s*cd%s+([^%s;&|\'"]+)%s*&&(.*)$')
  end
  if not d then
    return nil
  end
  return H.unquote(d), rest
end

function H.unquote(s)
  return s:match("^'(.*)'$") or s:match('^"(.*)"$') or s
end

--- `d` against `base`: absolute and `~` paths as they are, others joined.
function H.join(base, d)
  if d:match('^~') then
    return vim.fs.normalize(d)
  end
  if d:match('^/') then
    return vim.fs.normalize(d)
  end
  return vim.fs.normalize(base .. '/' .. d)
end

--- The 'errorformat' a `:compiler {name}` sets, read in a scratch buffer (cached).
---@param name string
---@return string?
function H.compiler_efm(name)
  if H.cache[name] == nil then
    local buf = vim.api.nvim_create_buf(false, true)
    local ok = pcall(vim.api.nvim_buf_call, buf, function()
      vim.cmd('silent compiler ' .. vim.fn.fnameescape(name))
    end)
    local efm = ok and vim.api.nvim_get_option_value('errorformat', { scope = 'local', buf = buf }) or ''
    vim.api.nvim_buf_delete(buf, { force = true })
    H.cache[name] = efm ~= '' and efm or false
  end
  return H.cache[name] or nil
end

return M
